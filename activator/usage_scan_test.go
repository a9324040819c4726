package activator

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// feed writes answer to a fresh answerUsage in pieces cut at random.
func feed(answer string, sse bool, rng *rand.Rand) *answerUsage {
	a := &answerUsage{sse: sse}
	for len(answer) > 0 {
		n := 1 + rng.IntN(len(answer))
		if rng.IntN(3) == 0 {
			n = 1 // byte by byte, often
		}
		a.write([]byte(answer[:n]))
		answer = answer[n:]
	}
	return a
}

func TestAnswerUsage(t *testing.T) {
	const usage5 = `{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}`
	for _, tc := range []struct {
		name               string
		answer             string
		sse                bool
		prompt, completion int
		found              bool
		events             int
	}{
		{name: "plain answer", answer: `{"id":"x","choices":[{"text":"hi"}],"usage":` + usage5 + `}`, prompt: 3, completion: 2, found: true},
		{name: "plain answer, usage first, spaces", answer: " {\n \"usage\" : " + usage5 + " ,\"id\":\"x\"}", prompt: 3, completion: 2, found: true},
		{name: "usage only inside a string", answer: `{"choices":[{"text":"\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":9}"}]}`},
		{name: "usage nested, not top level", answer: `{"choices":[{"usage":` + usage5 + `}],"x":{"usage":` + usage5 + `}}`},
		{name: "escaped quote before usage key", answer: `{"a":"x\\","usage":` + usage5 + `}`, prompt: 3, completion: 2, found: true},
		{name: "escaped backslash then quote", answer: `{"a":"x\\\\","usage":` + usage5 + `}`, prompt: 3, completion: 2, found: true},
		{name: "usage null", answer: `{"usage":null}`},
		{name: "cut usage", answer: `{"usage":{"prompt_tok`},
		{name: "not an object", answer: `[{"usage":` + usage5 + `}]`},
		{name: "an error body", answer: `{"error":{"message":"no","type":"invalid_request_error","param":null,"code":null}}`},
		{
			name:   "stream with usage",
			answer: "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":" + usage5 + "}\n\ndata: [DONE]\n\n",
			sse:    true, prompt: 3, completion: 2, found: true, events: 3,
		},
		{
			name:   "stream whose tokens say data: and usage",
			answer: "data: {\"choices\":[{\"text\":\"data: x\\n\\ndata: {\\\"usage\\\":{\\\"prompt_tokens\\\":7}}\"}]}\n\ndata: [DONE]\n\n",
			sse:    true, events: 2,
		},
		{
			name:   "stream with CRLF, CR, comments, other fields and joined data lines",
			answer: ": keep-alive\r\n\r\nevent: chunk\r\nid: 1\r\ndata: {\"choices\":[],\r\ndata: \"usage\":" + usage5 + "}\r\n\r\ndata:[DONE]\r\rretry: 10\n\n",
			sse:    true, prompt: 3, completion: 2, found: true, events: 2,
		},
		{
			name:   "the last usage wins (vLLM's continuous usage)",
			answer: "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n",
			sse:    true, prompt: 3, completion: 4, found: true, events: 3,
		},
		{
			name:   "an event not ended is not counted",
			answer: "data: {\"choices\":[]}\n\ndata: {\"usage\":" + usage5 + "}\n",
			sse:    true, events: 1,
		},
		{
			name:   "usage null in every chunk but the last",
			answer: "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":" + usage5 + "}\n\ndata: [DONE]\n\n",
			sse:    true, prompt: 3, completion: 2, found: true, events: 3,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			for try := range 50 {
				a := feed(tc.answer, tc.sse, rng)
				u, found := a.result()
				if found != tc.found || u.PromptTokens != tc.prompt || u.CompletionTokens != tc.completion || a.events() != tc.events {
					t.Fatalf("try %d: usage %+v found %v events %d; want %d/%d found %v events %d",
						try, u, found, a.events(), tc.prompt, tc.completion, tc.found, tc.events)
				}
			}
		})
	}
}

// TestAnswerUsageLongAnswer: a long answer's usage is found without the
// answer being kept, and an overlong usage value is refused.
func TestAnswerUsageLongAnswer(t *testing.T) {
	text := strings.Repeat(`tok \"{[}]\\ data: `, 20000)
	a := &answerUsage{}
	a.write([]byte(`{"choices":[{"text":"` + text + `"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`))
	if u, ok := a.result(); !ok || u.CompletionTokens != 2 {
		t.Fatalf("usage %+v, %v after a long text", u, ok)
	}
	if cap(a.body.val) > maxUsageBytes {
		t.Fatalf("kept %d bytes", cap(a.body.val))
	}
	b := &answerUsage{}
	b.write([]byte(`{"usage":{"prompt_tokens":1,"pad":"` + strings.Repeat("x", 2*maxUsageBytes) + `"}}`))
	if _, ok := b.result(); ok {
		t.Fatal("an overlong usage value was decoded")
	}
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream": true, "text/event-stream; charset=utf-8": true, "Text/Event-Stream": true,
		"application/json": false, "text/event-streams": false, "": false,
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v", ct, got)
		}
	}
}

func BenchmarkAnswerUsageStream(b *testing.B) {
	var events []string
	for range 16 {
		events = append(events, `data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"chat","choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null}]}`+"\n\n")
	}
	events = append(events, `data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"chat","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":16,"total_tokens":19,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n", "data: [DONE]\n\n")
	bs := make([][]byte, len(events))
	for i, e := range events {
		bs[i] = []byte(e)
	}
	b.ReportAllocs()
	for b.Loop() {
		a := answerUsage{sse: true}
		for _, e := range bs {
			a.write(e)
		}
		if u, ok := a.result(); !ok || u.CompletionTokens != 16 {
			b.Fatal(u, ok)
		}
	}
}
