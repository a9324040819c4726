package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Limits on the code a pushed checkpoint brings along. A chat template is a
// program (Jinja) and a pre-tokenizer regex is one too (backtracking): both
// come from files anyone who can push a model controls, so each run of them
// is bounded and a run past a bound fails that request, never the engine.
const (
	// ChatTemplateTimeout bounds one render. Real chat templates render in
	// well under a millisecond even for long conversations; a second is a
	// thousand times that, yet short enough that a looping template costs
	// a client one failed request rather than a stuck engine.
	ChatTemplateTimeout = time.Second

	// ChatTemplateMaxOutput caps a rendered prompt, in bytes. The prompt is
	// the messages plus a few markers per turn; 1 MiB is over 200k tokens,
	// more than any context window the engine serves, while bounding what a
	// template can make the engine hold.
	ChatTemplateMaxOutput = 1 << 20

	// ChatTemplateMaxIterations bounds the work units of one render: every
	// {% for %} body run, every macro call and every item range() makes.
	// A template loops over messages (and tools), so a real conversation
	// needs hundreds; 100k leaves room for very long ones and stops
	// `range(10**9)` or nested big loops after ~0.1 s of work.
	ChatTemplateMaxIterations = 100_000

	// ChatTemplateMaxRange is the most items range() makes. Gonja's own
	// range streams through a goroutine that a for loop then materialises
	// in full (range(1e9) grew an engine past 2.8 GB); ours builds a slice
	// and refuses more than this up front.
	ChatTemplateMaxRange = 100_000

	// chatTemplateMaxFrames bounds the Go stack of a render, counted in
	// frames at macro calls and every few loop iterations. Recursion
	// (a macro calling itself, a recursive loop) would otherwise end in a
	// stack overflow, which Go cannot recover: the process dies. 20k frames
	// is a few hundred levels of template recursion, a few MB of stack.
	chatTemplateMaxFrames = 20_000

	// chatTemplateGrace is how long past ChatTemplateTimeout the caller
	// waits for a render to notice its deadline before abandoning it.
	chatTemplateGrace = 250 * time.Millisecond

	// RegexMatchTimeout bounds each match of a normalizer or pre-tokenizer
	// regex (regexp2's MatchTimeout). The GPT-2 / Llama 3 splits match in
	// microseconds; a catastrophically backtracking pattern such as
	// `(a+)+$` never finishes on a long input. 100 ms per match is far
	// above the first and stops the second quickly.
	RegexMatchTimeout = 100 * time.Millisecond
)

// ErrChatTemplateLimit is wrapped by ApplyChatTemplate when the model's
// chat template ran past one of its limits (time, iterations, range size,
// output size, recursion depth): the request fails, the engine goes on.
var ErrChatTemplateLimit = errors.New("the model's chat template exceeded its limit")

// ErrRegexLimit is wrapped by EncodeChecked when a normalizer or
// pre-tokenizer regex ran past RegexMatchTimeout on the input.
var ErrRegexLimit = errors.New("the model's pre-tokenizer regex exceeded its match timeout")

// regexError turns a regexp2 error into one wrapping ErrRegexLimit. The
// engine's timeout message quotes the whole input, which is left out.
func regexError(err error) error {
	msg := err.Error()
	if strings.HasPrefix(msg, "match timeout") {
		return fmt.Errorf("%w (%v per match)", ErrRegexLimit, RegexMatchTimeout)
	}
	if len(msg) > 100 {
		msg = msg[:100] + "..."
	}
	return fmt.Errorf("%w: %s", ErrRegexLimit, msg)
}

// budgetKey names the render's budget in the template context. It is not a
// Jinja identifier (it has spaces), so a template can neither read nor
// overwrite it; were it missing, budgetOf fails closed.
const budgetKey = "stoke render budget"

// renderBudget is the state of one render's limits. It is used by the
// render goroutine only; the caller reads err after the render is done.
type renderBudget struct {
	deadline time.Time
	left     int
	ticks    int
	err      error
	pcs      []uintptr
}

func newRenderBudget() *renderBudget {
	return &renderBudget{deadline: time.Now().Add(ChatTemplateTimeout), left: ChatTemplateMaxIterations}
}

// fail records (the first) limit error and returns it.
func (b *renderBudget) fail(format string, args ...any) error {
	if b.err == nil {
		b.err = fmt.Errorf("%w: %s", ErrChatTemplateLimit, fmt.Sprintf(format, args...))
	}
	return b.err
}

// charge spends n work units and checks the deadline.
func (b *renderBudget) charge(n int) error {
	if b.err != nil {
		return b.err
	}
	b.left -= n
	if b.left < 0 {
		return b.fail("more than %d loop iterations, macro calls or range items", ChatTemplateMaxIterations)
	}
	return b.checkTime()
}

func (b *renderBudget) checkTime() error {
	if b.err != nil {
		return b.err
	}
	if time.Now().After(b.deadline) {
		return b.fail("rendering took longer than %v", ChatTemplateTimeout)
	}
	return nil
}

// checkStack fails when the render's goroutine is deeper than
// chatTemplateMaxFrames.
func (b *renderBudget) checkStack() error {
	if b.pcs == nil {
		b.pcs = make([]uintptr, chatTemplateMaxFrames)
	}
	if runtime.Callers(0, b.pcs) >= chatTemplateMaxFrames {
		return b.fail("recursion deeper than %d stack frames", chatTemplateMaxFrames)
	}
	return nil
}

func budgetOf(ctx *exec.Context) (*renderBudget, error) {
	v, _ := ctx.Get(budgetKey)
	b, ok := v.(*renderBudget)
	if !ok || b == nil {
		return nil, fmt.Errorf("%w: render budget missing (overwritten by the template?)", ErrChatTemplateLimit)
	}
	return b, nil
}

// limitWriter collects a render's output, failing past
// ChatTemplateMaxOutput or the deadline.
type limitWriter struct {
	buf bytes.Buffer
	b   *renderBudget
}

func (w *limitWriter) Write(p []byte) (int, error) {
	if err := w.b.checkTime(); err != nil {
		return 0, err
	}
	if w.buf.Len()+len(p) > ChatTemplateMaxOutput {
		return 0, w.b.fail("output larger than %d bytes", ChatTemplateMaxOutput)
	}
	return w.buf.Write(p)
}

// boundedRange is Jinja's range([start, ]stop[, step]) returning a slice of
// at most ChatTemplateMaxRange items, charged to the render's budget.
func boundedRange(e *exec.Evaluator, params *exec.VarArgs) ([]int, error) {
	start, stop, step := 0, 0, 1
	for _, a := range params.Args {
		if !a.IsInteger() {
			return nil, errors.New("range: expected signature is [start, ]stop[, step] where all arguments are integers")
		}
	}
	switch len(params.Args) {
	case 1:
		stop = params.Args[0].Integer()
	case 2:
		start, stop = params.Args[0].Integer(), params.Args[1].Integer()
	case 3:
		start, stop, step = params.Args[0].Integer(), params.Args[1].Integer(), params.Args[2].Integer()
	default:
		return nil, errors.New("range: expected signature is [start, ]stop[, step] where all arguments are integers")
	}
	if step == 0 {
		return nil, errors.New("range: step cannot be 0")
	}
	// The count, in uint64 so that extreme arguments cannot overflow.
	var n uint64
	switch {
	case step > 0 && stop > start:
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	case step < 0 && stop < start:
		n = (uint64(start)-uint64(stop)-1)/(uint64(-(step+1))+1) + 1
	}
	b, err := budgetOf(e.Environment.Context)
	if err != nil {
		return nil, err
	}
	if n > ChatTemplateMaxRange {
		return nil, b.fail("range() of %d items, more than %d", n, ChatTemplateMaxRange)
	}
	if err := b.charge(int(n)); err != nil {
		return nil, err
	}
	out := make([]int, n)
	for i := range out {
		out[i] = start + i*step
	}
	return out, nil
}

// budgetTick is a node put at the head of every {% for %} body and macro
// body: each run of the body charges one work unit and checks the
// deadline (and, for macros and every 16th tick, the stack depth).
type budgetTick struct {
	pos   *tokens.Token
	macro bool
}

func (t *budgetTick) Position() *tokens.Token { return t.pos }
func (t *budgetTick) String() string          { return "BudgetTick" }

func (t *budgetTick) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	b, err := budgetOf(r.Environment.Context)
	if err != nil {
		return err
	}
	if err := b.charge(1); err != nil {
		return err
	}
	b.ticks++
	if t.macro || b.ticks%16 == 0 {
		return b.checkStack()
	}
	return nil
}

func prependTick(w *nodes.Wrapper, macro bool) {
	if w == nil {
		return
	}
	pos := w.Location
	if pos == nil {
		pos = &tokens.Token{}
	}
	tick := &nodes.ControlStructureBlock{Location: pos, Name: "budget", ControlStructure: &budgetTick{pos: pos, macro: macro}}
	w.Nodes = append([]nodes.Node{tick}, w.Nodes...)
}

// chatControlStructures are the statements a chat template may use: gonja's
// builtins minus those that load other templates (include, import, from,
// extends — transformers' environment has no loader either, and a
// template including itself would recurse while parsing), with for and
// macro instrumented with budgetTick.
var chatControlStructures = func() *exec.ControlStructureSet {
	all := map[string]parser.ControlStructureParser{}
	for _, name := range []string{"autoescape", "block", "filter", "for", "if", "macro", "raw", "set", "with", "do", "break", "continue", "trans", "call"} {
		if p, ok := controlStructures.All.Get(name); ok {
			all[name] = p
		}
	}
	if forParser, ok := all["for"]; ok {
		all["for"] = func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
			cs, err := forParser(p, args)
			if f, ok := cs.(*controlStructures.ForControlStructure); ok && err == nil {
				prependTick(f.BodyWrapper, false)
			}
			return cs, err
		}
	}
	if macroParser, ok := all["macro"]; ok {
		all["macro"] = func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
			cs, err := macroParser(p, args)
			if m, ok := cs.(*controlStructures.MacroControlStructure); ok && err == nil && m.Macro != nil {
				prependTick(m.Macro.Wrapper, true)
			}
			return cs, err
		}
	}
	return exec.NewControlStructureSet(all)
}()
