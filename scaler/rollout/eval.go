// Package rollout is a rollout's eval gate: an eval set of prompts with
// reference answers, scored on a revision through OpenAI's completions
// API (exact match of the greedy answer, or the mean log-likelihood of
// the reference, teacher-forced with echo), and the verdict comparing the
// candidate revision's score with the stable one's.
package rollout

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/stokehq/stoke/internal/config"
)

// Item is one line of an eval set.
type Item struct {
	Prompt    string `json:"prompt"`
	Reference string `json:"reference"`
	// MaxTokens caps the exact-match completion (0: the gate's).
	MaxTokens int `json:"max_tokens,omitempty"`
}

// Limits of an eval set: it runs twice on live replicas, so it is a
// smoke test, not a benchmark.
const (
	MaxItems    = 10000
	MaxSetBytes = 16 << 20
)

// ParseSet reads a JSONL eval set; the error names the first bad line.
func ParseSet(data []byte) ([]Item, error) {
	if len(data) > MaxSetBytes {
		return nil, fmt.Errorf("eval set: %d bytes exceed the limit of %d", len(data), MaxSetBytes)
	}
	var items []Item
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), MaxSetBytes)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var it Item
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&it); err != nil {
			return nil, fmt.Errorf("eval set line %d: %w", n, err)
		}
		switch {
		case it.Prompt == "":
			return nil, fmt.Errorf("eval set line %d: prompt is required", n)
		case it.Reference == "":
			return nil, fmt.Errorf("eval set line %d: reference is required", n)
		case it.MaxTokens < 0 || it.MaxTokens > config.MaxEvalTokens:
			return nil, fmt.Errorf("eval set line %d: max_tokens %d is outside [0, %d]", n, it.MaxTokens, config.MaxEvalTokens)
		}
		if len(items) == MaxItems {
			return nil, fmt.Errorf("eval set: more than %d lines", MaxItems)
		}
		items = append(items, it)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("eval set: %w", err)
	}
	if len(items) == 0 {
		return nil, errors.New("eval set: no lines")
	}
	return items, nil
}

// RetryAfter is how long an eval request answered 429 or 503 waits
// before it is sent again.
const RetryAfter = 500 * time.Millisecond

// Complete answers one POST /v1/completions body (its model already set)
// and returns the answer's status and body.
type Complete func(ctx context.Context, body []byte) (status int, answer []byte, err error)

// Score is an eval set's result on one revision.
type Score struct {
	// Value is the metric's value: the fraction of exact matches, or the
	// mean log-probability per reference token.
	Value float64 `json:"value"`
	// Items is the lines scored; Matched the exact matches among them.
	Items   int `json:"items"`
	Matched int `json:"matched,omitempty"`
	// Tokens is the reference tokens the log-likelihood averages over.
	Tokens  int     `json:"tokens,omitempty"`
	Seconds float64 `json:"seconds"`
}

// Run scores items on one revision with the gate's metric, one request
// at a time.
func Run(ctx context.Context, complete Complete, items []Item, gate config.Eval) (Score, error) {
	start := time.Now()
	var s Score
	var sum float64
	for i, it := range items {
		switch gate.Metric {
		case config.EvalLogLikelihood:
			lp, n, err := logLikelihood(ctx, complete, it)
			if err != nil {
				return Score{}, fmt.Errorf("eval line %d: %w", i+1, err)
			}
			sum += lp
			s.Tokens += n
		default:
			max := it.MaxTokens
			if max == 0 {
				max = gate.MaxTokens
			}
			text, err := greedy(ctx, complete, it.Prompt, max)
			if err != nil {
				return Score{}, fmt.Errorf("eval line %d: %w", i+1, err)
			}
			if strings.TrimSpace(text) == strings.TrimSpace(it.Reference) {
				s.Matched++
			}
		}
		s.Items++
	}
	switch gate.Metric {
	case config.EvalLogLikelihood:
		if s.Tokens == 0 {
			return Score{}, errors.New("eval: the references have no tokens to score")
		}
		s.Value = sum / float64(s.Tokens)
	default:
		s.Value = float64(s.Matched) / float64(s.Items)
	}
	s.Seconds = time.Since(start).Seconds()
	return s, nil
}

// completion is the part of a completions answer the eval reads.
type completion struct {
	Choices []struct {
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string   `json:"tokens"`
			TokenLogprobs []*float64 `json:"token_logprobs"`
			TextOffset    []int      `json:"text_offset"`
		} `json:"logprobs"`
	} `json:"choices"`
}

func ask(ctx context.Context, complete Complete, req map[string]any) (*completion, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var status int
	var answer []byte
	for {
		if status, answer, err = complete(ctx, body); err != nil {
			return nil, err
		}
		if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
			break
		}
		// No replica had room in time (a canary still loading, say): the
		// gate's timeout bounds the wait, not the buffer's.
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("answered %d until the eval's time ran out: %w", status, ctx.Err())
		case <-time.After(RetryAfter):
		}
	}
	if status != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		msg := strings.TrimSpace(string(answer))
		if json.Unmarshal(answer, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		return nil, fmt.Errorf("answered %d: %s", status, msg)
	}
	var c completion
	if err := json.Unmarshal(answer, &c); err != nil {
		return nil, fmt.Errorf("read the answer: %w", err)
	}
	if len(c.Choices) != 1 {
		return nil, fmt.Errorf("answer has %d choices, want 1", len(c.Choices))
	}
	return &c, nil
}

// greedy is the temperature-0 completion of prompt.
func greedy(ctx context.Context, complete Complete, prompt string, maxTokens int) (string, error) {
	c, err := ask(ctx, complete, map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0})
	if err != nil {
		return "", err
	}
	return c.Choices[0].Text, nil
}

// logLikelihood is the summed log-probability of the reference's tokens
// after the prompt and how many there are: the prompt and the reference
// sent as one echoed prompt with no completion, the tokens at or past the
// prompt's length read back (lm-eval-harness's loglikelihood request).
func logLikelihood(ctx context.Context, complete Complete, it Item) (float64, int, error) {
	c, err := ask(ctx, complete, map[string]any{"prompt": it.Prompt + it.Reference, "max_tokens": 0, "echo": true, "logprobs": 0})
	if err != nil {
		return 0, 0, err
	}
	lp := c.Choices[0].Logprobs
	if lp == nil || len(lp.TokenLogprobs) != len(lp.TextOffset) {
		return 0, 0, errors.New("the answer carries no prompt log-probabilities")
	}
	var sum float64
	n := 0
	for i, off := range lp.TextOffset {
		if off < len(it.Prompt) {
			continue
		}
		p := lp.TokenLogprobs[i]
		if p == nil {
			return 0, 0, fmt.Errorf("reference token %d has no log-probability", i)
		}
		sum += *p
		n++
	}
	return sum, n, nil
}

// Verdict is a gate's decision with the figures it was taken on.
type Verdict struct {
	Metric        string  `json:"metric"`
	Stable        Score   `json:"stable"`
	Candidate     Score   `json:"candidate"`
	Regression    float64 `json:"regression"`
	MaxRegression float64 `json:"max_regression"`
	Promote       bool    `json:"promote"`
}

// Judge compares the candidate's score with the stable one's: both
// metrics are better higher, and the candidate is promoted unless it
// falls short by more than the gate's MaxRegression.
func Judge(gate config.Eval, stable, candidate Score) Verdict {
	v := Verdict{Metric: gate.Metric, Stable: stable, Candidate: candidate, MaxRegression: gate.MaxRegression,
		Regression: stable.Value - candidate.Value}
	v.Promote = !math.IsNaN(v.Regression) && v.Regression <= gate.MaxRegression+1e-12
	return v
}

// String says the verdict in one line, as a rejected revision's reason.
func (v Verdict) String() string {
	word := "rejected"
	if v.Promote {
		word = "promoted"
	}
	return fmt.Sprintf("%s: %s %.4g on the candidate against %.4g on the stable revision (regression %.4g, at most %.4g allowed; %d lines)",
		word, v.Metric, v.Candidate.Value, v.Stable.Value, v.Regression, v.MaxRegression, v.Candidate.Items)
}
