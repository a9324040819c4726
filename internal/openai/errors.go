// Package openai holds the OpenAI wire types stoke speaks: the requests and
// responses of /v1/completions and /v1/chat/completions (streamed chunks
// included), /v1/models, vLLM's /tokenize and /detokenize, and the error
// body {"error":{"message","type","param","code"}}. It only describes and
// checks the JSON; turning a request into engine work is the server's job.
package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Error types, as the OpenAI API names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable_error"
	TypeConflict       = "conflict_error"
)

// Error is an API error: the HTTP status to answer with and the fields of
// the error body. It is a Go error so handlers can return it.
type Error struct {
	Status  int
	Message string
	Type    string
	// Param names the request field at fault; empty means null.
	Param string
	// Code is a machine-readable reason such as "model_not_found"; empty
	// means null.
	Code string
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// Body is the JSON the client receives.
func (e *Error) Body() ErrorBody {
	d := ErrorDetail{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		d.Param = &e.Param
	}
	if e.Code != "" {
		d.Code = &e.Code
	}
	return ErrorBody{Error: d}
}

// ErrorBody is the OpenAI error shape {"error":{...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// InvalidRequest is a 400 invalid_request_error blaming param (may be
// empty); the message should name the field too.
func InvalidRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: TypeInvalidRequest, Param: param}
}

// CodeContextLength is the code of a request too long for the model's
// context, as OpenAI answers it.
const CodeContextLength = "context_length_exceeded"

// ContextTooLong is a 400 for a prompt (with its max_tokens) longer than
// the model's context.
func ContextTooLong(param, format string, args ...any) *Error {
	e := InvalidRequest(param, format, args...)
	e.Code = CodeContextLength
	return e
}

// Unsupported is a 400 for a parameter the server does not implement.
func Unsupported(param, format string, args ...any) *Error {
	e := InvalidRequest(param, format, args...)
	e.Code = "unsupported_parameter"
	return e
}

// MaxEcho is the most bytes of a client's value (a model name, an id, a
// path, X-Request-Id) an answer echoes; longer ones are cut (a client's
// 1 MB name does not come back as a 1 MB answer).
const MaxEcho = 256

// Echo is s cut to at most MaxEcho bytes, at a UTF-8 boundary, for
// echoing a client's value back.
func Echo(s string) string {
	n := MaxEcho
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 { // not inside a UTF-8 sequence
		n--
	}
	return s[:n]
}

// ModelNotFound is the 404 OpenAI and vLLM answer for a model they do not
// serve; the name is echoed cut (Echo), marked with "…" when it was.
func ModelNotFound(model string) *Error {
	if e := Echo(model); e != model {
		model = e + "…"
	}
	return &Error{Status: http.StatusNotFound, Message: fmt.Sprintf("The model `%s` does not exist.", model),
		Type: TypeInvalidRequest, Param: "model", Code: "model_not_found"}
}

// NotFound is a 404 for anything else that does not exist.
func NotFound(format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Message: fmt.Sprintf(format, args...), Type: TypeNotFound, Code: "not_found"}
}

// RouteNotFound is the 404 for a path no route serves (with any method).
func RouteNotFound(method, path string) *Error {
	return NotFound("no route %s %s", method, path)
}

// MethodNotAllowed is the 405 for a path that is served, but not with
// method; allow lists the methods it takes, as the Allow header does.
func MethodNotAllowed(method, path, allow string) *Error {
	return &Error{Status: http.StatusMethodNotAllowed,
		Message: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", method, path, allow),
		Type:    TypeInvalidRequest, Code: "method_not_allowed"}
}

// BodyTooLarge is the 413 for a request body over limit bytes.
func BodyTooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body exceeds the limit of %d bytes", limit),
		Type: TypeInvalidRequest, Code: "request_too_large"}
}

// Unavailable is a 503: the server cannot serve now (no model, sleeping,
// draining).
func Unavailable(format string, args ...any) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Message: fmt.Sprintf(format, args...), Type: TypeUnavailable, Code: "service_unavailable"}
}

// Conflict is a 409: the operation does not fit the server's state.
func Conflict(format string, args ...any) *Error {
	return &Error{Status: http.StatusConflict, Message: fmt.Sprintf(format, args...), Type: TypeConflict, Code: "conflict"}
}

// ServerError is a 500: the server failed, not the request.
func ServerError(format string, args ...any) *Error {
	return &Error{Status: http.StatusInternalServerError, Message: fmt.Sprintf(format, args...), Type: TypeServer}
}

// Decode parses a request body into v. Malformed JSON, a value of the wrong
// type or a bad union value becomes a 400 that names the field where one is
// known.
func Decode(data []byte, v any) *Error {
	err := json.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var fe *FieldError
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &fe):
		return InvalidRequest(fe.Field, "%s", fe.Error())
	case errors.As(err, &te) && te.Field != "":
		field := jsonPath(te.Field)
		return InvalidRequest(field, "invalid type for %s: expected %s, got JSON %s", field, te.Type, te.Value)
	case errors.As(err, &te):
		return InvalidRequest("", "request body must be a JSON object, got JSON %s", te.Value)
	case errors.As(err, &se):
		return InvalidRequest("", "invalid JSON in request body at byte %d: %v", se.Offset, se)
	}
	return InvalidRequest("", "invalid JSON in request body: %v", strings.TrimPrefix(err.Error(), "json: "))
}

// FieldError is returned by the union types' UnmarshalJSON when a value
// has none of the accepted shapes; Decode turns it into a 400 whose param
// is Field.
type FieldError struct {
	Field  string
	Reason string
}

// Error reads like "prompt must be a string, an array of strings or an array of token ids".
func (e *FieldError) Error() string { return e.Field + " " + e.Reason }

// jsonPath drops the Go names of embedded structs (which encoding/json
// puts in UnmarshalTypeError.Field) from a field path, leaving the JSON
// names: "GenerationParams.max_tokens" becomes "max_tokens".
func jsonPath(field string) string {
	parts := strings.Split(field, ".")
	kept := parts[:0]
	for _, p := range parts {
		if p != "" && p[0] >= 'A' && p[0] <= 'Z' {
			continue
		}
		kept = append(kept, p)
	}
	if len(kept) == 0 {
		return field
	}
	return strings.Join(kept, ".")
}
