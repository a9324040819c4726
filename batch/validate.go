package batch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/stokehq/stoke/internal/store"
)

// maxReportedErrors is how many validation errors a failed batch lists.
const maxReportedErrors = 100

// LineError is one validation error of a batch's input, as OpenAI lists
// them in a batch's errors.
type LineError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	// Line is the input file's line (1-based), nil for the whole file.
	Line *int `json:"line"`
}

// inputLine is one line of a batch's input file.
type inputLine struct {
	CustomID *string         `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// validate reads a batch's input file and returns its lines, ready to
// record, or the errors that fail it. Each line must be a JSON object with
// a unique custom_id, method POST, the batch's endpoint as url and a body
// naming a served model; streaming is refused (a batch line's answer is
// one JSON body).
func (s *Service) validate(ctx context.Context, b Batch) ([]store.BatchLine, []LineError, error) {
	_, rc, err := s.o.Files.Open(ctx, b.Owner, b.InputFileID)
	if err != nil {
		return nil, []LineError{{Code: "invalid_input_file", Message: "the input file " + b.InputFileID + " cannot be read: " + err.Error()}}, nil
	}
	defer rc.Close()
	var (
		lines []store.BatchLine
		errs  []LineError
		seen  = map[string]int{}
	)
	fail := func(line int, code, param, format string, args ...any) {
		if len(errs) >= maxReportedErrors {
			return
		}
		e := LineError{Code: code, Message: fmt.Sprintf("line %d: ", line) + fmt.Sprintf(format, args...), Line: &line}
		if param != "" {
			e.Param = &param
		}
		errs = append(errs, e)
	}
	r := bufio.NewReaderSize(rc, 1<<20)
	for n := 1; ; n++ {
		raw, err := r.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("read input file %s: %w", b.InputFileID, err)
		}
		if text := bytes.TrimSpace(raw); len(text) > 0 {
			if l, ok := s.checkLine(n, text, b, seen, fail); ok {
				lines = append(lines, l)
			}
		}
		if err != nil { // io.EOF
			break
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
	}
	if len(lines) == 0 && len(errs) == 0 {
		errs = append(errs, LineError{Code: "empty_file", Message: "the input file holds no requests"})
	}
	return lines, errs, nil
}

// checkLine checks one non-empty line; fail records its errors.
func (s *Service) checkLine(n int, text []byte, b Batch, seen map[string]int,
	fail func(line int, code, param, format string, args ...any)) (store.BatchLine, bool) {
	endpoint := b.Endpoint
	var in inputLine
	dec := json.NewDecoder(bytes.NewReader(text))
	if err := dec.Decode(&in); err != nil || dec.More() {
		fail(n, "invalid_json_line", "", "not a JSON object: %s", jsonError(err))
		return store.BatchLine{}, false
	}
	ok := true
	switch {
	case in.CustomID == nil || *in.CustomID == "":
		fail(n, "missing_required_parameter", "custom_id", "custom_id is required")
		ok = false
	case seen[*in.CustomID] > 0:
		fail(n, "duplicate_custom_id", "custom_id", "custom_id %q is also the custom_id of line %d; each must be unique", *in.CustomID, seen[*in.CustomID])
		ok = false
	default:
		seen[*in.CustomID] = n
	}
	if in.Method != "POST" {
		fail(n, "invalid_method", "method", "method must be POST, not %q", in.Method)
		ok = false
	}
	if in.URL != endpoint {
		fail(n, "mismatched_endpoint", "url", "url %q is not the batch's endpoint %s", in.URL, endpoint)
		ok = false
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(in.Body, &body); err != nil || body == nil {
		fail(n, "invalid_request", "body", "body must be a JSON object")
		return store.BatchLine{}, false
	}
	var model string
	if err := json.Unmarshal(body["model"], &model); err != nil || model == "" {
		fail(n, "missing_required_parameter", "body.model", "body.model is required")
		ok = false
	} else if !s.o.Models.Known(model) || len(b.Models) > 0 && !slices.Contains(b.Models, model) {
		fail(n, "model_not_found", "body.model", "the model %q does not exist", model)
		ok = false
	}
	if stream := string(body["stream"]); stream == "true" {
		fail(n, "invalid_request", "body.stream", "a batch line cannot stream its answer")
		ok = false
	}
	if !ok {
		return store.BatchLine{}, false
	}
	return store.BatchLine{Line: n, CustomID: *in.CustomID, Body: in.Body}, true
}

// jsonError is a decode error as the one-line message of a line's error.
func jsonError(err error) string {
	if err == nil {
		return "more than one JSON value on the line"
	}
	return err.Error()
}
