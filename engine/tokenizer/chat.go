package tokenizer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Message is one chat turn handed to ApplyChatTemplate.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatTemplateName is the template's name inside its in-memory loader.
const chatTemplateName = "/chat_template.jinja"

// parseChatTemplate parses a Jinja chat template the way transformers sets
// up Jinja (trim_blocks, lstrip_blocks), in the bounded environment of
// limits.go (range capped, loops and macros charged to a budget, no
// include/import/extends). An error means the template does not compile.
func parseChatTemplate(src string) (ct *chatTemplate, err error) {
	defer func() {
		if r := recover(); r != nil {
			ct, err = nil, fmt.Errorf("template parser failed: %v", r)
		}
	}()
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	globals := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	globals.Set("range", boundedRange)
	env := &exec.Environment{
		Context:           globals,
		Filters:           builtins.Filters,
		Tests:             builtins.Tests,
		ControlStructures: chatControlStructures,
		Methods:           builtins.Methods,
	}
	loader, err := loaders.NewMemoryLoader(map[string]string{chatTemplateName: src})
	if err != nil {
		return nil, err
	}
	tmpl, err := exec.NewTemplate(chatTemplateName, cfg, loader, env)
	if err != nil {
		return nil, err
	}
	return &chatTemplate{source: src, tmpl: tmpl}, nil
}

// ValidateChatTemplate reports whether src compiles as a chat template
// (in the environment ApplyChatTemplate renders it in). Loading a
// tokenizer whose tokenizer_config.json or chat_template.jinja holds a
// template that does not compile fails with this error; a watcher can call
// it to reject such a checkpoint before loading it. It does not run the
// template: limits on running it are enforced per request.
func ValidateChatTemplate(src string) error {
	_, err := parseChatTemplate(src)
	return err
}

// HasChatTemplate reports whether tokenizer_config.json holds a chat
// template that parsed; without one ApplyChatTemplate uses the plain format.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ErrTemplateException is wrapped by ApplyChatTemplate when the template
// itself rejects the conversation with raise_exception (for example a
// system message where the model allows none): the request is at fault, not
// the server.
var ErrTemplateException = errors.New("chat template raised an exception")

// ApplyChatTemplate renders msgs into a prompt with the model's chat
// template (Jinja, given messages, add_generation_prompt, bos_token,
// eos_token and raise_exception). Without a usable template it writes
// "role: content" lines, plus "assistant: " when addGenerationPrompt.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	if t.chat == nil {
		var sb strings.Builder
		for _, m := range msgs {
			sb.WriteString(m.Role)
			sb.WriteString(": ")
			sb.WriteString(m.Content)
			sb.WriteByte('\n')
		}
		if addGenerationPrompt {
			sb.WriteString("assistant: ")
		}
		return sb.String(), nil
	}
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	raised, hasRaised := "", false
	raise := func(_ *exec.Evaluator, args *exec.VarArgs) (*exec.Value, error) {
		if len(args.Args) > 0 {
			raised = args.Args[0].String()
		}
		hasRaised = true
		return nil, ErrTemplateException
	}
	data := exec.NewContext(map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.bosToken,
		"eos_token":             t.eosToken,
		"raise_exception":       raise,
		"strftime_now":          strftimeNow,
	})
	out, err := t.chat.render(data)
	if errors.Is(err, ErrChatTemplateLimit) {
		// Checked first: after a timeout the render goroutine may still be
		// running, so raised/hasRaised must not be read.
		return "", err
	}
	if hasRaised {
		return "", fmt.Errorf("render chat_template: %w: %s", ErrTemplateException, raised)
	}
	if err != nil {
		return "", fmt.Errorf("render chat_template: %w", err)
	}
	return out, nil
}

// render runs the template on data within the limits of limits.go.
//
// It renders in its own goroutine and waits at most ChatTemplateTimeout
// (plus a grace period). The goroutine cannot be killed, so what bounds it
// after the caller gave up is the template's own instrumentation: every
// loop iteration, macro call, range() and output write checks the deadline
// and the iteration budget, range() allocates at most ChatTemplateMaxRange
// items, output is capped at ChatTemplateMaxOutput and stack depth at
// chatTemplateMaxFrames. Only a single builtin operation that does not
// loop through the template (a filter on a huge value) can outlive the
// deadline, and its inputs are bounded by those same limits.
func (c *chatTemplate) render(data *exec.Context) (string, error) {
	b := newRenderBudget()
	data.Set(budgetKey, b)
	w := &limitWriter{b: b}
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("template engine failed: %v", r)
			}
		}()
		done <- c.tmpl.Execute(w, data)
	}()
	timer := time.NewTimer(ChatTemplateTimeout + chatTemplateGrace)
	defer timer.Stop()
	select {
	case err := <-done:
		if b.err != nil {
			return "", b.err
		}
		if err != nil {
			return "", err
		}
		return w.buf.String(), nil
	case <-timer.C:
		return "", fmt.Errorf("%w: rendering took longer than %v", ErrChatTemplateLimit, ChatTemplateTimeout)
	}
}

// strftimeNow is transformers' strftime_now(format): the current local time
// in a C strftime format (common directives only).
func strftimeNow(_ *exec.Evaluator, args *exec.VarArgs) (*exec.Value, error) {
	format := "%Y-%m-%d"
	if len(args.Args) > 0 {
		format = args.Args[0].String()
	}
	return exec.AsValue(strftime(time.Now(), format)), nil
}

func strftime(now time.Time, format string) string {
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			sb.WriteString(strconv.Itoa(now.Year()))
		case 'y':
			fmt.Fprintf(&sb, "%02d", now.Year()%100)
		case 'm':
			fmt.Fprintf(&sb, "%02d", int(now.Month()))
		case 'd':
			fmt.Fprintf(&sb, "%02d", now.Day())
		case 'H':
			fmt.Fprintf(&sb, "%02d", now.Hour())
		case 'M':
			fmt.Fprintf(&sb, "%02d", now.Minute())
		case 'S':
			fmt.Fprintf(&sb, "%02d", now.Second())
		case 'b':
			sb.WriteString(now.Month().String()[:3])
		case 'B':
			sb.WriteString(now.Month().String())
		case 'a':
			sb.WriteString(now.Weekday().String()[:3])
		case 'A':
			sb.WriteString(now.Weekday().String())
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteByte('%')
			sb.WriteByte(format[i])
		}
	}
	return sb.String()
}
