package batch

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// ResultLine is a line of a batch's output or error file, in OpenAI's
// shape: the answer's status and body, or an error when the request was
// never answered (expired, cancelled).
type ResultLine struct {
	ID       string          `json:"id"`
	CustomID string          `json:"custom_id"`
	Response *ResultResponse `json:"response"`
	Error    *ResultError    `json:"error"`
}

// ResultResponse is the answer a line got.
type ResultResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// ResultError is why a line got no answer.
type ResultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Codes of lines that got no answer.
const (
	CodeExpired   = "batch_expired"
	CodeCancelled = "batch_cancelled"
)

// maxAnswerBytes bounds one line's answer held in memory.
const maxAnswerBytes = 16 << 20

// answer is an http.ResponseWriter that keeps a line's answer in memory.
type answer struct {
	header http.Header
	status int
	body   bytes.Buffer
	over   bool // the answer was longer than maxAnswerBytes
}

func newAnswer() *answer { return &answer{header: http.Header{}} }

func (a *answer) Header() http.Header { return a.header }

func (a *answer) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
}

func (a *answer) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	if a.body.Len()+len(p) > maxAnswerBytes {
		a.over = true
		return len(p), nil
	}
	return a.body.Write(p)
}
