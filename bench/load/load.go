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
	// URL is the server's base URL (http://host:port); Model the model
	// name requests carry; APIKey, when set, goes as a bearer token.
	URL, Model, APIKey string
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
	// Seed seeds the arrivals and lengths (0: a random seed).
	Seed uint64
	// Client makes the requests (default: a client with many idle
	// connections per host and no timeout).
	Client *http.Client
	// OnResult, when set, hears of each request as it ends (progress).
	OnResult func(Result)
}

// Run sends the load and returns every request's result and how long the
// sending and the last answers took.
func Run(ctx context.Context, o Options) ([]Result, time.Duration, error) {
	if o.Rate <= 0 && o.Concurrency <= 0 {
		return nil, 0, errors.New("load: give a rate or a concurrency")
	}
	if o.Duration <= 0 && o.Requests <= 0 {
		return nil, 0, errors.New("load: give a duration or a number of requests")
	}
	if o.Burstiness <= 0 {
		o.Burstiness = 1
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}}
	}
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
	start := time.Now()
	deadline := time.Time{}
	if o.Duration > 0 {
		deadline = start.Add(o.Duration)
	}
	more := func(sent int) bool {
		return ctx.Err() == nil && (o.Requests <= 0 || sent < o.Requests) && (deadline.IsZero() || time.Now().Before(deadline))
	}
	next := func() (int, int) { // lengths drawn in one place, in order, for reproducible runs
		mu.Lock()
		defer mu.Unlock()
		return o.Input.Draw(rng), o.Output.Draw(rng)
	}
	if o.Rate > 0 {
		at := start
		for i := 0; more(i); i++ {
			in, out := next()
			if wait := time.Until(at); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
				if !more(i) {
					break
				}
			}
			wg.Add(1)
			go func() { defer wg.Done(); record(send(ctx, o, i, in, out)) }()
			mu.Lock()
			at = at.Add(time.Duration(interarrival(rng, o.Rate, o.Burstiness) * float64(time.Second)))
			mu.Unlock()
		}
	} else {
		var sent sync.Mutex
		n := 0
		for range o.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					sent.Lock()
					i := n
					ok := more(i)
					n++
					sent.Unlock()
					if !ok {
						return
					}
					in, out := next()
					record(send(ctx, o, i, in, out))
				}
			}()
		}
	}
	wg.Wait()
	return results, time.Since(start), nil
}

// prompt is a prompt of about n tokens: numbered so that no two requests
// share a cached prefix, then a word a token.
func prompt(i, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d:", i)
	for range max(0, n-1) {
		b.WriteString(" the")
	}
	return b.String()
}

// send makes one streamed completion and times its events.
func send(ctx context.Context, o Options, i, in, out int) Result {
	body, _ := json.Marshal(map[string]any{"model": o.Model, "prompt": prompt(i, in), "max_tokens": out, "stream": true,
		"ignore_eos": true, "stream_options": map[string]any{"include_usage": true}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(o.URL, "/")+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return Result{Code: "bad_request"}
	}
	req.Header.Set("Content-Type", "application/json")
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	r := Result{Sent: time.Now(), InputTokens: in}
	resp, err := o.Client.Do(req)
	if err != nil {
		r.End, r.Code = time.Now(), "connection"
		return r
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		r.End = time.Now()
		if json.Unmarshal(data, &e) == nil && e.Error.Code != "" {
			r.Code = e.Error.Code
		}
		return r
	}
	return readStream(resp.Body, r, time.Now)
}

// readStream reads an SSE completion stream into r: the time of each event
// with text (from now), the usage, and an error event's code.
func readStream(body io.Reader, r Result, now func() time.Time) Result {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	counted := 0
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			break
		}
		var ev struct {
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
		t := now()
		if json.Unmarshal([]byte(data), &ev) != nil {
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
				r.Events = append(r.Events, t)
				counted++
				break
			}
		}
		if ev.Usage != nil {
			r.InputTokens, r.OutputTokens = ev.Usage.PromptTokens, ev.Usage.CompletionTokens
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
