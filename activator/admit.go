package activator

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/stokehq/stoke/internal/openai"
)

// AdmitRequest is what an admission check (Options.Admit) decides on: a
// request's model and an upper bound of the tokens it may use.
type AdmitRequest struct {
	Model string
	// PromptBytes is the length of the prompt or messages as sent: no
	// tokenizer makes more tokens than bytes, so it bounds the prompt's
	// tokens from above.
	PromptBytes int
	// MaxTokens is the request's max_tokens (or max_completion_tokens); 0
	// when it set none.
	MaxTokens int
	// RequestID is the request's X-Request-Id.
	RequestID string
}

// Outcome is how an admitted request ended.
type Outcome struct {
	// Status is the answer's HTTP status.
	Status int
	// Usage is the answer's usage; Known is false when it carried none.
	Usage openai.Usage
	Known bool
	// TTFT is the time to the answer's first byte, Duration to its end
	// (its last byte held back, see Admitted.Hold).
	TTFT, Duration time.Duration
	// Route is the route the client named ("" for a deployment), Served
	// the deployment or provider that answered ("" when none did), and
	// Fallbacks how many targets of the route's chain passed it on first.
	Route, Served string
	Fallbacks     int
}

// Admitted is a request an admission check let in.
type Admitted struct {
	// MaxTokens, when the request set none, is the max_tokens the
	// activator sets in its body (the bound its tokens were reserved
	// with); 0 leaves the body alone.
	MaxTokens int
	// Done, when set, is called once the request is over, with how it
	// ended.
	Done func(Outcome)
	// Flow is whose turn the request takes in the buffer's fair order
	// (a tenant's id; "" for the shared flow).
	Flow string
	// Priority, when set, replaces the client's priority (a key's class),
	// kept in the interactive band.
	Priority *int
	// Hold keeps the end of a successful answer (the last byte of a plain
	// one, the closing [DONE] event of a stream) from the client until
	// Done has returned: a client never holds a whole answer whose Done
	// (its usage record) did not happen.
	Hold bool
}

// Admit is Options.Admit: it lets a request in (setting, on w, the headers
// its answer should carry), or answers why not.
type Admit func(ctx context.Context, w http.ResponseWriter, r AdmitRequest) (Admitted, *openai.Error)

// admit runs the admission check on a parsed request for deployment
// model and returns the body to forward (with max_tokens set when the
// check asked for it).
func (a *Activator) admit(rec *recorder, req *http.Request, ir *inferenceRequest, model string, body []byte) ([]byte, Flow, *openai.Error) {
	if a.opts.Admit == nil {
		return body, Flow{}, nil
	}
	asked := ir.maxTokens()
	got, e := a.opts.Admit(req.Context(), rec, AdmitRequest{Model: model, PromptBytes: len(ir.Prompt) + len(ir.Messages), MaxTokens: asked,
		RequestID: req.Header.Get("X-Request-Id")})
	if e != nil {
		return nil, Flow{}, e
	}
	rec.done, rec.hold = got.Done, got.Hold && got.Done != nil
	if got.Priority != nil && !IsBatch(ir.Priority) {
		ir.Priority = ClampClientPriority(*got.Priority)
	}
	flow := Flow{ID: got.Flow, Cost: float64(len(ir.Prompt) + len(ir.Messages) + outputBound(asked, got.MaxTokens))}
	if got.MaxTokens > 0 && asked == 0 {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(body, &fields); err != nil {
			return nil, Flow{}, openai.InvalidRequest("", "request body must be a JSON object")
		}
		fields["max_tokens"] = json.RawMessage(strconv.Itoa(got.MaxTokens))
		out, err := json.Marshal(fields)
		if err != nil {
			return nil, Flow{}, openai.ServerError("set max_tokens: %v", err)
		}
		return out, flow, nil
	}
	return body, flow, nil
}

// outputBound is the output a request is weighed with in the fair order:
// its max_tokens, else the one admission set, else defaultFlowTokens.
func outputBound(asked, set int) int {
	switch {
	case asked > 0:
		return asked
	case set > 0:
		return set
	}
	return defaultFlowTokens
}

// defaultFlowTokens is the output a request that bounds none is weighed
// with in the fair order.
const defaultFlowTokens = 256
