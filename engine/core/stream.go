package core

import (
	"context"
	"sync"

	"github.com/stokehq/stoke/engine/sample"
)

// Finish reasons, as OpenAI reports them.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
	FinishError  = "error"
)

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens are prompt tokens the prefix cache supplied.
	CachedTokens int
}

// Delta is what a request produced since the last Next: new text and
// token ids, and once it ends, why and its usage.
type Delta struct {
	Text     string
	IDs      []int32
	Logprobs []sample.Logprobs
	// PromptLogprobs, for a request with Params.PromptLogprobs, score the
	// prompt tokens after the first, in order: it is set (non-nil, empty
	// for a one-token prompt) in exactly one delta, the one returned once
	// the whole prompt is computed, before or with the first token's.
	PromptLogprobs []sample.Logprobs
	// Finish is empty until the request ends.
	Finish string
	Err    error
	Usage  Usage
}

// Stream carries one request's output from the engine loop to its reader.
// The loop never blocks on a slow reader: output accumulates until Next
// collects it.
type Stream struct {
	// ID names the request, e.g. for Engine.Abort.
	ID string

	mu       sync.Mutex
	pending  Delta
	finished bool
	taken    bool
	notify   chan struct{}
}

func newStream(id string) *Stream {
	return &Stream{ID: id, notify: make(chan struct{}, 1)}
}

// Next waits for output and returns everything accumulated since the
// last call. ok is false once the final delta has been returned (or ctx
// ended; the caller then aborts the request).
func (s *Stream) Next(ctx context.Context) (d Delta, ok bool) {
	for {
		s.mu.Lock()
		if s.taken {
			s.mu.Unlock()
			return Delta{}, false
		}
		if s.finished || s.pending.Text != "" || len(s.pending.IDs) > 0 || s.pending.PromptLogprobs != nil {
			d, s.pending = s.pending, Delta{}
			s.taken = s.finished
			s.mu.Unlock()
			return d, true
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Delta{}, false
		}
	}
}

// push adds output; a non-empty finish ends the stream.
func (s *Stream) push(text string, id int32, lp *sample.Logprobs) {
	s.mu.Lock()
	s.pending.Text += text
	s.pending.IDs = append(s.pending.IDs, id)
	if lp != nil {
		s.pending.Logprobs = append(s.pending.Logprobs, *lp)
	}
	s.mu.Unlock()
	s.wake()
}

// pushPrompt adds the prompt's logprobs (never nil: a one-token prompt has
// none).
func (s *Stream) pushPrompt(lps []sample.Logprobs) {
	if lps == nil {
		lps = []sample.Logprobs{}
	}
	s.mu.Lock()
	s.pending.PromptLogprobs = lps
	s.mu.Unlock()
	s.wake()
}

func (s *Stream) finish(text, reason string, usage Usage, err error) {
	s.mu.Lock()
	if !s.finished {
		s.pending.Text += text
		s.pending.Finish, s.pending.Usage, s.pending.Err = reason, usage, err
		s.finished = true
	}
	s.mu.Unlock()
	s.wake()
}

func (s *Stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}
