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
// up Jinja (trim_blocks, lstrip_blocks). It returns nil when the template
// does not parse, so callers fall back to the plain format.
func parseChatTemplate(src string) (ct *chatTemplate) {
	defer func() {
		if recover() != nil {
			ct = nil
		}
	}()
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	env := &exec.Environment{
		Context:           exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables),
		Filters:           builtins.Filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	loader, err := loaders.NewMemoryLoader(map[string]string{chatTemplateName: src})
	if err != nil {
		return nil
	}
	tmpl, err := exec.NewTemplate(chatTemplateName, cfg, loader, env)
	if err != nil {
		return nil
	}
	return &chatTemplate{source: src, tmpl: tmpl}
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
	if hasRaised {
		return "", fmt.Errorf("render chat_template: %w: %s", ErrTemplateException, raised)
	}
	if err != nil {
		return "", fmt.Errorf("render chat_template: %w", err)
	}
	return out, nil
}

func (c *chatTemplate) render(data *exec.Context) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("template engine failed: %v", r)
		}
	}()
	return c.tmpl.ExecuteToString(data)
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
