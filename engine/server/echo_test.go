package server

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kernels"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/sched"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/openai"
	"github.com/stokehq/stoke/internal/testmodel"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

// storiesPrompt is long enough (27 tokens with BOS) that a step budget of
// 8 tokens prefills it in four chunks, and two of its blocks can come
// from the prefix cache.
const storiesPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."

// stories is the trained stories260K served with prefix caching and a
// small step budget (chunked prefill), and a second instance of the model
// for reference scores (Forward is not safe for concurrent use).
type stories struct {
	*fixture
	ref *model.Model
	tok *tokenizer.Tokenizer
}

// newStories serves stories260K; it skips (or fails under
// STOKE_REQUIRE_SHARED=1) without the shared checkpoint.
func newStories(t *testing.T, stepTokens int) *stories {
	t.Helper()
	dir := testmodel.Dir(t)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	load := func(ctx context.Context, req engineapi.LoadRequest, _ func(engineapi.LoadProgress)) (*Loaded, error) {
		pool := kernels.NewPool(2)
		m, ck, err := checkpoint.LoadModel(dir, pool)
		if err != nil {
			pool.Close()
			return nil, err
		}
		const blocks = 64
		ctxLen := m.Config().MaxPositionEmbeddings
		return &Loaded{
			Name:        "stories260K",
			Tokenizer:   tok,
			MaxModelLen: ctxLen,
			VocabSize:   m.Config().VocabSize,
			Start: func(metrics *core.Metrics) (*core.Engine, error) {
				storage, err := kvcache.New(m.KVShape(), blocks)
				if err != nil {
					return nil, err
				}
				cfg := core.Config{Sched: sched.Config{MaxNumBatchedTokens: stepTokens, MaxNumSeqs: 8, MaxModelLen: ctxLen}, EOS: tok.EOS()}
				return core.New(cfg, kvcache.NewManager(blocks, true), core.NewModelExecutor(m, storage), tok, metrics)
			},
			Close: func() error { pool.Close(); return ck.Close() },
		}, nil
	}
	f := newFixture(t, load, "stories", Options{})
	pool := kernels.NewPool(1)
	t.Cleanup(pool.Close)
	ref, ck, err := checkpoint.LoadModel(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return &stories{fixture: f, ref: ref, tok: tok}
}

// logSoftmax is the reference log-probabilities of one row of logits, in
// float64.
func logSoftmax(row []float32) []float64 {
	m := math.Inf(-1)
	for _, l := range row {
		m = max(m, float64(l))
	}
	var z float64
	for _, l := range row {
		z += math.Exp(float64(l) - m)
	}
	lse := m + math.Log(z)
	out := make([]float64, len(row))
	for i, l := range row {
		out[i] = float64(l) - lse
	}
	return out
}

// tokenName is how the logprobs name token id: its bytes when they are
// UTF-8, as head.token writes it.
func tokenName(tok *tokenizer.Tokenizer, id int32) string {
	h := head{tok: tok}
	name, _ := h.token(id)
	return name
}

// completion posts a completion request and decodes the answer.
func (f *fixture) completion(t *testing.T, body string) openai.CompletionResponse {
	t.Helper()
	var resp openai.CompletionResponse
	f.postJSON(t, "/v1/completions", body, &resp)
	if len(resp.Choices) != 1 {
		t.Fatalf("%s: %d choices", body, len(resp.Choices))
	}
	return resp
}

// logprobValues dereferences token_logprobs, nulls as NaN.
func logprobValues(lp *openai.CompletionLogprobs) []float64 {
	out := make([]float64, len(lp.TokenLogprobs))
	for i, v := range lp.TokenLogprobs {
		out[i] = math.NaN()
		if v != nil {
			out[i] = *v
		}
	}
	return out
}

// TestEchoScoresThePrompt checks the lm-eval-harness request (echo,
// logprobs, max_tokens 0) on the trained model, its prompt prefilled in
// chunks: exactly the prompt comes back, its first token's logprob null,
// every other one the log-softmax of the reference's logits at the
// position before it, with the top alternatives and text offsets into the
// prompt. The same request again, its prompt now in the prefix cache (a
// plain request shows it would hit), scores it the same and takes nothing
// from the cache.
func TestEchoScoresThePrompt(t *testing.T) {
	s := newStories(t, 8)
	ids := s.tok.Encode(storiesPrompt, true)
	logits, err := s.ref.Score(ids)
	if err != nil {
		t.Fatal(err)
	}
	vocab := s.ref.Config().VocabSize
	const k = 3
	body := jsonBody(map[string]any{"prompt": storiesPrompt, "echo": true, "logprobs": k, "max_tokens": 0})
	first := s.completion(t, body)
	c := first.Choices[0]
	lp := c.Logprobs
	if c.Text != storiesPrompt || c.FinishReason == nil || *c.FinishReason != core.FinishLength {
		t.Fatalf("text %q, finish %v: want the prompt alone, finished by length", c.Text, c.FinishReason)
	}
	if u := first.Usage; u.PromptTokens != len(ids) || u.CompletionTokens != 0 || u.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage %+v, want %d prompt tokens, none generated or cached", u, len(ids))
	}
	if lp == nil || len(lp.Tokens) != len(ids) || len(lp.TokenLogprobs) != len(ids) || len(lp.TopLogprobs) != len(ids) || len(lp.TextOffset) != len(ids) {
		t.Fatalf("logprobs %+v, want %d entries each", lp, len(ids))
	}
	if lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil || lp.TextOffset[0] != 0 {
		t.Fatalf("first token: logprob %v, top %v, offset %d: want null, null, 0", lp.TokenLogprobs[0], lp.TopLogprobs[0], lp.TextOffset[0])
	}
	for i := 1; i < len(ids); i++ {
		want := logSoftmax(logits[(i-1)*vocab : i*vocab])
		name := tokenName(s.tok, ids[i])
		got := logprobValues(lp)[i]
		if lp.Tokens[i] != name || !(math.Abs(got-want[ids[i]]) <= 1e-5) {
			t.Fatalf("token %d %q: %q with logprob %v, want %q with %v", i, name, lp.Tokens[i], got, name, want[ids[i]])
		}
		// top_logprobs: the k most likely tokens, and the token itself.
		order := make([]int, vocab)
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case want[a] > want[b]:
				return -1
			case want[a] < want[b]:
				return 1
			}
			return 0
		})
		top := lp.TopLogprobs[i]
		expect := map[string]float64{name: want[ids[i]]}
		for _, id := range order[:k] {
			expect[tokenName(s.tok, int32(id))] = want[id]
		}
		if len(top) != len(expect) {
			t.Fatalf("token %d: top_logprobs %v, want %v", i, top, expect)
		}
		for n, v := range expect {
			if g, ok := top[n]; !ok || math.Abs(g-v) > 1e-5 {
				t.Fatalf("token %d: top_logprobs %v, want %v", i, top, expect)
			}
		}
		// Offsets index the echoed text: past the first word, each token's
		// bytes start there.
		off := lp.TextOffset[i]
		if off < lp.TextOffset[i-1] || off > len(c.Text) {
			t.Fatalf("token %d: text_offset %d after %d in %d bytes", i, off, lp.TextOffset[i-1], len(c.Text))
		}
		if i >= 2 && !strings.HasPrefix(c.Text[off:], string(s.tok.TokenBytes(ids[i]))) {
			t.Fatalf("token %d %q at text_offset %d: the text there is %q", i, name, off, c.Text[off:])
		}
	}

	plain := s.completion(t, jsonBody(map[string]any{"prompt": storiesPrompt, "max_tokens": 1, "temperature": 0}))
	if plain.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("a plain request after the echo found no cached prompt tokens (usage %+v): the prefix cache would not hit", plain.Usage)
	}
	again := s.completion(t, body)
	if again.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("the echo again took %d prompt tokens from the prefix cache", again.Usage.PromptTokensDetails.CachedTokens)
	}
	a, b := again.Choices[0].Logprobs, lp
	if got, want := logprobValues(a), logprobValues(b); !slices.EqualFunc(got, want, func(x, y float64) bool { return x == y || (math.IsNaN(x) && math.IsNaN(y)) }) {
		t.Fatalf("the echo again scored the prompt %v, first %v", got, want)
	}
	if again.Choices[0].Text != c.Text || !slices.Equal(a.Tokens, b.Tokens) || !slices.Equal(a.TextOffset, b.TextOffset) {
		t.Fatalf("the echo again answered %+v, first %+v", again.Choices[0], c)
	}
}

// TestEchoWithGeneration checks echo with tokens to generate: the text is
// the prompt then what the same request without echo generates (greedy),
// and the logprobs are the prompt's then the plain request's, their text
// offsets shifted by the prompt's length.
func TestEchoWithGeneration(t *testing.T) {
	s := newStories(t, 8)
	n := len(s.tok.Encode(storiesPrompt, true))
	for _, tc := range []struct {
		name     string
		logprobs any
	}{
		{"logprobs 0", 0},
		{"logprobs 2", 2},
		{"no logprobs", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := map[string]any{"prompt": storiesPrompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true}
			if tc.logprobs != nil {
				req["logprobs"] = tc.logprobs
			}
			plain := s.completion(t, jsonBody(req)).Choices[0]
			req["echo"] = true
			echoed := s.completion(t, jsonBody(req))
			e := echoed.Choices[0]
			if e.Text != storiesPrompt+plain.Text || plain.Text == "" {
				t.Fatalf("echo text %q, want the prompt then %q", e.Text, plain.Text)
			}
			if echoed.Usage.CompletionTokens != 12 || echoed.Usage.PromptTokens != n {
				t.Fatalf("echo usage %+v", echoed.Usage)
			}
			if tc.logprobs == nil {
				if e.Logprobs != nil {
					t.Fatalf("logprobs %+v without asking", e.Logprobs)
				}
				return
			}
			lp, want := e.Logprobs, plain.Logprobs
			if lp == nil || want == nil || len(lp.Tokens) != n+len(want.Tokens) {
				t.Fatalf("echo logprobs %+v, plain %+v: want %d prompt tokens first", lp, want, n)
			}
			got, exp := logprobValues(lp), logprobValues(want)
			if !math.IsNaN(got[0]) || slices.ContainsFunc(got[1:], math.IsNaN) {
				t.Fatalf("prompt token_logprobs %v: want null first, then numbers", got[:n])
			}
			for j := range want.Tokens {
				i := n + j
				if lp.Tokens[i] != want.Tokens[j] || got[i] != exp[j] ||
					lp.TextOffset[i] != want.TextOffset[j]+len(storiesPrompt) || len(lp.TopLogprobs[i]) != len(want.TopLogprobs[j]) {
					t.Fatalf("generated token %d: echo %q %v at %d, plain %q %v at %d", j, lp.Tokens[i], got[i], lp.TextOffset[i],
						want.Tokens[j], exp[j], want.TextOffset[j])
				}
			}
		})
	}
}

// streamCompletion reads a streamed completion: its text, its logprobs
// concatenated, the chunks' texts and the last finish reason.
func (f *fixture) streamCompletion(t *testing.T, body string) (text string, lp *openai.CompletionLogprobs, chunks []string, finish string) {
	t.Helper()
	st := f.openStream(t, "/v1/completions", body)
	for {
		data, ok := st.next(t)
		if !ok || data == "[DONE]" {
			return text, lp, chunks, finish
		}
		var ch openai.CompletionResponse
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		if len(ch.Choices) == 0 {
			continue // the usage chunk
		}
		c := ch.Choices[0]
		text += c.Text
		chunks = append(chunks, c.Text)
		if c.FinishReason != nil {
			finish = *c.FinishReason
		}
		if c.Logprobs != nil {
			if lp == nil {
				lp = &openai.CompletionLogprobs{}
			}
			lp.Tokens = append(lp.Tokens, c.Logprobs.Tokens...)
			lp.TokenLogprobs = append(lp.TokenLogprobs, c.Logprobs.TokenLogprobs...)
			lp.TopLogprobs = append(lp.TopLogprobs, c.Logprobs.TopLogprobs...)
			lp.TextOffset = append(lp.TextOffset, c.Logprobs.TextOffset...)
		}
	}
}

// TestEchoStreams checks that a streamed echo sends the prompt (with its
// logprobs when asked) in its first chunk and adds up to the answer of
// the same request unstreamed.
func TestEchoStreams(t *testing.T) {
	s := newStories(t, 8)
	n := len(s.tok.Encode(storiesPrompt, true))
	for _, tc := range []struct {
		name      string
		maxTokens int
		logprobs  any
	}{
		{"prompt only, logprobs", 0, 1},
		{"generating, logprobs", 6, 1},
		{"generating, no logprobs", 6, nil},
		{"prompt only, no logprobs", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := map[string]any{"prompt": storiesPrompt, "echo": true, "max_tokens": tc.maxTokens, "temperature": 0, "ignore_eos": true}
			if tc.logprobs != nil {
				req["logprobs"] = tc.logprobs
			}
			whole := s.completion(t, jsonBody(req)).Choices[0]
			req["stream"] = true
			text, lp, chunks, finish := s.streamCompletion(t, jsonBody(req))
			if text != whole.Text || finish != *whole.FinishReason || len(chunks) == 0 || !strings.HasPrefix(chunks[0], storiesPrompt) {
				t.Fatalf("streamed %q in chunks %q (finish %q), want %q (finish %q), the prompt first", text, chunks, finish, whole.Text, *whole.FinishReason)
			}
			if tc.logprobs == nil {
				if lp != nil {
					t.Fatalf("streamed logprobs %+v without asking", lp)
				}
				return
			}
			want := whole.Logprobs
			if lp == nil || len(lp.Tokens) != len(want.Tokens) || len(lp.Tokens) != n+tc.maxTokens ||
				!slices.Equal(lp.Tokens, want.Tokens) || !slices.Equal(lp.TextOffset, want.TextOffset) {
				t.Fatalf("streamed logprobs %+v, want %+v", lp, want)
			}
			got, exp := logprobValues(lp), logprobValues(want)
			if !math.IsNaN(got[0]) || !slices.Equal(got[1:], exp[1:]) {
				t.Fatalf("streamed token_logprobs %v, want %v", got, exp)
			}
		})
	}
}

// TestEchoEdges checks echo on the random-weight model: a prompt filling
// the whole context is scored with max_tokens 0, a token-id prompt echoes
// as its decoded text, a one-token prompt has its single null logprob,
// and without a tokenizer the tokens are named by id with empty text.
func TestEchoEdges(t *testing.T) {
	f := newModelFixture(t, true, Options{})
	full := make([]int, testCtx)
	for i := range full {
		full[i] = 3 + i%200
	}
	resp := f.completion(t, jsonBody(map[string]any{"prompt": full, "echo": true, "max_tokens": 0, "logprobs": 1}))
	lp := resp.Choices[0].Logprobs
	if resp.Usage.PromptTokens != testCtx || resp.Usage.CompletionTokens != 0 || lp == nil || len(lp.TokenLogprobs) != testCtx {
		t.Fatalf("a prompt filling the context: usage %+v, logprobs %+v", resp.Usage, lp)
	}
	if got := logprobValues(lp); !math.IsNaN(got[0]) || slices.ContainsFunc(got[1:], math.IsNaN) || slices.ContainsFunc(got[1:], func(v float64) bool { return v > 0 }) {
		t.Fatalf("token_logprobs %v: want null, then logprobs (at most 0)", got)
	}
	if resp.Choices[0].Text != f.loader.tok.Decode(toInt32(full), true) {
		t.Fatalf("token-id prompt echoed as %q, want its decoded text", resp.Choices[0].Text)
	}

	one := f.completion(t, `{"prompt":[5],"echo":true,"max_tokens":0,"logprobs":0}`)
	if lp := one.Choices[0].Logprobs; lp == nil || len(lp.Tokens) != 1 || lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil {
		t.Fatalf("one-token prompt: %+v", one.Choices[0])
	}
	b, err := json.Marshal(one.Choices[0].Logprobs)
	if err != nil || !strings.Contains(string(b), `"token_logprobs":[null],"top_logprobs":[null]`) {
		t.Fatalf("one-token prompt logprobs JSON %s (%v): want nulls", b, err)
	}

	bare := newModelFixture(t, false, Options{})
	resp = bare.completion(t, `{"prompt":[5,6,7],"echo":true,"max_tokens":2,"logprobs":0,"temperature":0,"ignore_eos":true}`)
	lp = resp.Choices[0].Logprobs
	if resp.Choices[0].Text != "" || lp == nil || len(lp.Tokens) != 5 || lp.Tokens[0] != "token_id:5" ||
		!slices.Equal(lp.TextOffset[:4], []int{0, len("token_id:5"), 2 * len("token_id:5"), 3 * len("token_id:5")}) {
		t.Fatalf("echo without a tokenizer: %+v", resp.Choices[0])
	}
}

func toInt32(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// TestEchoOnSim checks echo on the sim engine, which has no logits:
// echoing the text works, prompt logprobs are refused with a 400 naming
// echo.
func TestEchoOnSim(t *testing.T) {
	f := newFixture(t, simLoader(t), "llama-3.1-8b-fp8-h100", Options{})
	checkErrorCases(t, f, []errorCase{
		{name: "echo with logprobs", path: "/v1/completions", body: `{"prompt":"Hello there","echo":true,"logprobs":0,"max_tokens":0}`,
			status: 400, param: "echo", code: "unsupported_parameter", message: "no model logits"},
	})
	for _, tc := range []struct {
		name      string
		maxTokens int
	}{{"prompt only", 0}, {"generating", 4}} {
		t.Run(tc.name, func(t *testing.T) {
			resp := f.completion(t, jsonBody(map[string]any{"prompt": "Hello there", "echo": true, "max_tokens": tc.maxTokens, "ignore_eos": true}))
			c := resp.Choices[0]
			if !strings.HasPrefix(c.Text, "Hello there") || (tc.maxTokens == 0) != (c.Text == "Hello there") ||
				resp.Usage.CompletionTokens != tc.maxTokens || c.Logprobs != nil {
				t.Fatalf("sim echo, max_tokens %d: %+v, usage %+v", tc.maxTokens, c, resp.Usage)
			}
		})
	}
	// Logprobs without echo stay as the sim serves them: none.
	if resp := f.completion(t, `{"prompt":"Hello","max_tokens":2,"logprobs":1}`); resp.Choices[0].Logprobs != nil {
		t.Fatalf("sim logprobs without echo: %+v", resp.Choices[0].Logprobs)
	}
}
