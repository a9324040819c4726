package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Options say what load to send.
type Options struct {
	// URL is the server's base URL (http://host:port); APIKey, when set,
	// goes as a bearer token.
	URL, APIKey string
	// Models are the models requests name (round-robin, or drawn by
	// weight).
	Models Mix
	// Rate is the open loop's mean requests a second; Burstiness the
	// gamma shape of its gaps (1: Poisson; default 1). Concurrency, when
	// Rate is 0, is the closed loop's clients, each sending its next
	// request when its last one ends.
	Rate, Burstiness float64
	Concurrency      int
	// Duration bounds the sending (and Requests the count, when set);
	// requests in flight at the end are waited for.
	Duration time.Duration
	Requests int
	// Input and Output are the prompt and answer lengths in tokens; the
	// answers are held to Output with ignore_eos.
	Input, Output Dist
	// PrefixTokens, when set, starts every prompt with one of
	// PrefixGroups (default 1) fixed prefixes of about that many tokens,
	// chosen at random per request, before its own part of Input tokens:
	// a shared-prefix (prefix repetition) load.
	PrefixTokens, PrefixGroups int
	// Trace, when set, replaces Rate and Concurrency: its requests are
	// sent at their times divided by TraceSpeed (default 1), with their
	// models (those without one drawn from Models) and lengths; Duration
	// and Requests, when set, cut it short.
	Trace      []TraceEntry
	TraceSpeed float64
	// Seed seeds the arrivals, lengths, models and prefixes (0: a random
	// seed).
	Seed uint64
	// Tag starts every prompt, so that no two runs share a cached prompt
	// prefix (default: drawn at random).
	Tag string
	// Client makes the requests (default: a client with many idle
	// connections per host and no timeout).
	Client *http.Client
	// OnSend, when set, hears of each request as it is sent, OnResult of
	// each as it ends (progress).
	OnSend   func()
	OnResult func(Result)

	clock clock // time as Run sees it (default: the real one); tests set it
}

// clock is time as Run sees it.
type clock interface {
	Now() time.Time
	// Sleep returns once d has passed or ctx is done.
	Sleep(ctx context.Context, d time.Duration)
}

// realClock is the wall clock.
type realClock struct{}

// Now is the wall clock's time.
func (realClock) Now() time.Time { return time.Now() }

// Sleep waits on the wall clock.
func (realClock) Sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// request is what one request asks for.
type request struct {
	i       int
	model   string
	in, out int
	group   int // the shared prefix it starts with; -1 for none
}

// check validates o and fills in its defaults.
func (o *Options) check() error {
	if len(o.Models.Names) == 0 {
		return errors.New("load: name a model")
	}
	if o.Trace == nil {
		if o.Rate <= 0 && o.Concurrency <= 0 {
			return errors.New("load: give a rate or a concurrency")
		}
		if o.Duration <= 0 && o.Requests <= 0 {
			return errors.New("load: give a duration or a number of requests")
		}
	}
	if o.PrefixTokens < 0 || o.PrefixGroups < 0 {
		return errors.New("load: prefix tokens and groups are ≥ 0")
	}
	if o.PrefixGroups > 0 && o.PrefixTokens == 0 {
		return errors.New("load: prefix groups need a prefix length")
	}
	if o.PrefixTokens > 0 && o.PrefixGroups == 0 {
		o.PrefixGroups = 1
	}
	if o.Burstiness <= 0 {
		o.Burstiness = 1
	}
	if o.TraceSpeed <= 0 {
		o.TraceSpeed = 1
	}
	if o.Tag == "" {
		o.Tag = fmt.Sprintf("%08x", rand.Uint32())
	}
	if o.clock == nil {
		o.clock = realClock{}
	}
	return nil
}

// Run sends the load and returns every request's result and how long the
// sending and the last answers took.
func Run(ctx context.Context, o Options) ([]Result, time.Duration, error) {
	if err := o.check(); err != nil {
		return nil, 0, err
	}
	if o.Client == nil {
		tr := &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}
		defer tr.CloseIdleConnections()
		o.Client = &http.Client{Transport: tr}
	}
	clk := o.clock
	seed := o.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	var mu sync.Mutex
	var results []Result
	var wg sync.WaitGroup
	record := func(r Result) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
		if o.OnResult != nil {
			o.OnResult(r)
		}
	}
	// draw makes request i, its draws in one place, in order, for
	// reproducible runs; e, when set, is its trace entry.
	draw := func(i int, e *TraceEntry) request {
		mu.Lock()
		defer mu.Unlock()
		q := request{i: i, group: -1}
		if e != nil {
			q.in, q.out, q.model = e.InputTokens, e.OutputTokens, e.Model
		} else {
			q.in, q.out = o.Input.Draw(rng), o.Output.Draw(rng)
		}
		if q.model == "" {
			q.model = o.Models.pick(i, rng)
		}
		if o.PrefixGroups > 0 {
			q.group = rng.IntN(o.PrefixGroups)
		}
		return q
	}
	start := clk.Now()
	if o.Trace != nil || o.Rate > 0 {
		var at time.Duration // when request i is due, from the start
		for i := 0; ctx.Err() == nil && (o.Requests <= 0 || i < o.Requests); i++ {
			var q request
			if o.Trace != nil {
				if i >= len(o.Trace) {
					break
				}
				at = time.Duration(float64(o.Trace[i].Time) / o.TraceSpeed)
				q = draw(i, &o.Trace[i])
			} else {
				q = draw(i, nil)
			}
			if o.Duration > 0 && at >= o.Duration {
				break
			}
			clk.Sleep(ctx, start.Add(at).Sub(clk.Now()))
			if ctx.Err() != nil {
				break
			}
			if o.OnSend != nil {
				o.OnSend()
			}
			sent := clk.Now()
			wg.Add(1)
			go func() { defer wg.Done(); record(send(ctx, o, q, sent)) }()
			if o.Trace == nil {
				mu.Lock()
				at += time.Duration(interarrival(rng, o.Rate, o.Burstiness) * float64(time.Second))
				mu.Unlock()
			}
		}
	} else {
		deadline := time.Time{}
		if o.Duration > 0 {
			deadline = start.Add(o.Duration)
		}
		var sent sync.Mutex
		n := 0
		for range o.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					sent.Lock()
					i := n
					ok := ctx.Err() == nil && (o.Requests <= 0 || i < o.Requests) && (deadline.IsZero() || clk.Now().Before(deadline))
					n++
					sent.Unlock()
					if !ok {
						return
					}
					q := draw(i, nil)
					if o.OnSend != nil {
						o.OnSend()
					}
					record(send(ctx, o, q, clk.Now()))
				}
			}()
		}
	}
	wg.Wait()
	return results, clk.Now().Sub(start), nil
}

// prompt is request q's prompt: its group's shared prefix, if any, then
// a part of about q.in tokens of its own that starts with the run's tag
// and the request's number, so that no two requests (of this run or
// another) share more than the prefix.
func prompt(tag string, q request, prefixTokens int) string {
	var b strings.Builder
	if q.group >= 0 {
		b.WriteString(sharedPrefix(tag, q.group, prefixTokens))
	}
	fmt.Fprintf(&b, "%s-%d:", tag, q.i)
	words(&b, q.in-1)
	return b.String()
}

// sharedPrefix is the prefix of about n tokens that the prompts of group
// share in the run tagged tag.
func sharedPrefix(tag string, group, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s-shared-%d:", tag, group)
	words(&b, n-1)
	b.WriteString("\n")
	return b.String()
}

// words writes n words of a token each.
func words(b *strings.Builder, n int) {
	for range max(0, n) {
		b.WriteString(" the")
	}
}

// send makes one streamed completion, sent at sent, and times its events.
func send(ctx context.Context, o Options, q request, sent time.Time) Result {
	body, _ := json.Marshal(map[string]any{"model": q.model, "prompt": prompt(o.Tag, q, o.PrefixTokens), "max_tokens": q.out, "stream": true,
		"ignore_eos": true, "stream_options": map[string]any{"include_usage": true}})
	r := Result{Sent: sent, Model: q.model, InputTokens: q.in}
	if q.group >= 0 {
		r.InputTokens += o.PrefixTokens
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(o.URL, "/")+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		r.End, r.Code = sent, "bad_request"
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	resp, err := o.Client.Do(req)
	if err != nil {
		r.End, r.Code = o.clock.Now(), "connection"
		return r
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		r.End = o.clock.Now()
		if json.Unmarshal(data, &e) == nil && e.Error.Code != "" {
			r.Code = e.Error.Code
		}
		return r
	}
	return readStream(resp.Body, r, o.clock.Now)
}

// readStream reads an SSE completion stream into r: the time of each event
// with text (from now), the usage, and an error event's code.
func readStream(body io.Reader, r Result, now func() time.Time) Result {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 4<<10), 4<<20)
	counted := 0
	var ev streamEvent
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			break
		}
		t := now()
		text, known := hasText(data)
		if !known {
			ev = streamEvent{}
			if json.Unmarshal(data, &ev) != nil {
				continue
			}
			if ev.Error != nil {
				r.Code = ev.Error.Code
				if r.Code == "" {
					r.Code = "stream_error"
				}
			}
			for _, c := range ev.Choices {
				if c.Text != "" || c.Delta.Content != "" {
					text = true
					break
				}
			}
			if ev.Usage != nil {
				r.InputTokens, r.OutputTokens = ev.Usage.PromptTokens, ev.Usage.CompletionTokens
			}
		}
		if text {
			r.Events = append(r.Events, t)
			counted++
		}
	}
	r.End = now()
	if err := sc.Err(); err != nil && r.Code == "" {
		r.Code = "stream_cut"
	}
	if r.OutputTokens == 0 {
		r.OutputTokens = counted
	}
	return r
}

// streamEvent is the part of a stream's event readStream reads.
type streamEvent struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Code string `json:"code"`
	} `json:"error"`
}

// hasText says, without decoding, whether a compact token event carries
// text: a "content" or "text" string that is not empty, and no usage or
// error to read. known is false when it cannot tell (another layout, an
// event with usage or an error): the event is then decoded.
func hasText(data []byte) (text, known bool) {
	if bytes.Contains(data, []byte(`"usage":{`)) || bytes.Contains(data, []byte(`"error"`)) {
		return false, false
	}
	for _, key := range [][]byte{[]byte(`"content":"`), []byte(`"text":"`)} {
		if i := bytes.Index(data, key); i >= 0 && i+len(key) < len(data) {
			return data[i+len(key)] != '"', true
		}
	}
	return false, false
}
