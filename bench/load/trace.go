package load

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"
)

// TraceEntry is one request of a trace: when it is sent, counted from the
// replay's start, which model it names ("" for one drawn from the load's
// mix) and its prompt and answer lengths in tokens.
type TraceEntry struct {
	Time         time.Duration
	Model        string
	InputTokens  int
	OutputTokens int
	// Line is the line of the trace it came from (1-based).
	Line int
}

// ReadTrace reads a JSONL trace file (see ParseTrace).
func ReadTrace(path string) ([]TraceEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	entries, err := ParseTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return entries, nil
}

// ParseTrace reads a JSONL trace, a request a line:
//
//	{"time": 1.25, "model": "chat", "input_tokens": 512, "output_tokens": 128}
//
// time is seconds from the replay's start (≥ 0), model is optional, the
// lengths are whole numbers ≥ 1; other fields are ignored, blank lines
// skipped. The entries come back in order of time (lines with the same
// time in file order). An error names the line.
func ParseTrace(r io.Reader) ([]TraceEntry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var out []TraceEntry
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		e, err := parseTraceLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		e.Line = n
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", len(out)+1, err)
	}
	if len(out) == 0 {
		return nil, errors.New("no requests in it")
	}
	slices.SortStableFunc(out, func(a, b TraceEntry) int { return cmp.Compare(a.Time, b.Time) })
	return out, nil
}

// parseTraceLine reads one line's object.
func parseTraceLine(line []byte) (TraceEntry, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil || fields == nil {
		return TraceEntry{}, fmt.Errorf("not a JSON object: %.60s", line)
	}
	number := func(name string) (float64, error) {
		raw, ok := fields[name]
		if !ok {
			return 0, fmt.Errorf("no %q", name)
		}
		var f float64
		if err := json.Unmarshal(raw, &f); err != nil {
			return 0, fmt.Errorf("%q is %s, want a number", name, raw)
		}
		return f, nil
	}
	length := func(name string) (int, error) {
		f, err := number(name)
		if err != nil {
			return 0, err
		}
		if f < 1 || f != math.Trunc(f) || f > 1<<30 {
			return 0, fmt.Errorf("%q is %v, want a whole number ≥ 1", name, f)
		}
		return int(f), nil
	}
	var e TraceEntry
	secs, err := number("time")
	if err != nil {
		return e, err
	}
	if secs < 0 || secs > 1e9 {
		return e, fmt.Errorf(`"time" is %v, want seconds from the start ≥ 0`, secs)
	}
	e.Time = time.Duration(secs * float64(time.Second))
	if raw, ok := fields["model"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &e.Model); err != nil {
			return e, fmt.Errorf(`"model" is %s, want a string`, raw)
		}
	}
	if e.InputTokens, err = length("input_tokens"); err != nil {
		return e, err
	}
	e.OutputTokens, err = length("output_tokens")
	return e, err
}
