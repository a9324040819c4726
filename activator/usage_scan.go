package activator

import (
	"bytes"
	"encoding/json"

	"github.com/stokehq/stoke/internal/openai"
)

// An answer's token usage is read as typed data while the answer passes
// through, without keeping the answer: a plain answer is one JSON object
// whose top-level "usage" member is decoded; a stream is split into its
// server-sent events (SSE, by the WHATWG event-stream grammar) and each
// event's data is read the same way, the last usage found winning (the
// chunk OpenAI's stream_options.include_usage adds before [DONE], or
// vLLM's continuous usage, which grows). Only the bytes of a top-level
// "usage" value are kept and decoded; the rest is walked once, byte by
// byte, tracking strings and nesting, so a token that contains `"usage"`
// or "data: " is just text.

// maxUsageBytes bounds the usage value kept for decoding; a longer one is
// not a usage object stoke knows.
const maxUsageBytes = 4096

// jsonUsage finds the top-level "usage" member of one JSON object given
// in pieces (Write) and decodes it.
type jsonUsage struct {
	state  uint8
	depth  int  // nesting inside the current top-level value
	esc    bool // the previous byte in a string was a backslash
	key    [5]byte
	keyLen int  // bytes of the current top-level key; past 5 it is not "usage"
	keyEsc bool // the key had an escape: not read as "usage"
	keep   bool // the current value is usage's: kept in val
	val    []byte

	found bool
	usage openai.Usage
}

const (
	jBegin      uint8 = iota // before the object's '{'
	jKey                     // expecting a key's '"' or the closing '}'
	jKeyString               // in a key
	jColon                   // after a key
	jValue                   // expecting a value
	jString                  // in a top-level string value
	jNested                  // in a top-level object or array value
	jNestedStr               // in a string inside one
	jScalar                  // in a number, true, false or null
	jAfterValue              // expecting ',' or '}'
	jDone                    // the object ended, or this is not an object
)

func (j *jsonUsage) reset() {
	val := j.val[:0]
	*j = jsonUsage{val: val}
}

// nestedStop and stringStop are the bytes that matter inside a nested
// value and inside a string.
var nestedStop, stringStop [256]bool

func init() {
	for _, c := range []byte(`"{}[]`) {
		nestedStop[c] = true
	}
	stringStop['"'], stringStop['\\'] = true, true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// write feeds the next bytes of the object.
func (j *jsonUsage) write(p []byte) {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch j.state {
		case jBegin:
			switch {
			case isSpace(c):
			case c == '{':
				j.state = jKey
			default:
				j.state = jDone
			}
		case jKey:
			switch {
			case isSpace(c) || c == ',':
			case c == '"':
				j.state, j.keyLen, j.keyEsc = jKeyString, 0, false
			default: // '}' or not JSON
				j.state = jDone
			}
		case jKeyString:
			switch {
			case j.esc:
				j.esc = false
			case c == '\\':
				j.esc, j.keyEsc = true, true
			case c == '"':
				j.state = jColon
			default:
				if j.keyLen < len(j.key) {
					j.key[j.keyLen] = c
				}
				j.keyLen++
			}
		case jColon:
			switch {
			case isSpace(c):
			case c == ':':
				j.state = jValue
				j.keep = !j.keyEsc && j.keyLen == 5 && string(j.key[:]) == "usage"
				j.val = j.val[:0]
			default:
				j.state = jDone
			}
		case jValue:
			switch {
			case isSpace(c):
				continue
			case c == '"':
				j.state = jString
			case c == '{' || c == '[':
				j.state, j.depth = jNested, 1
			default:
				j.state = jScalar
			}
			j.keepByte(c)
		case jString, jNestedStr: // a top-level string value, or one inside a nested value
			k := i
			if !j.esc {
				for k < len(p) && !stringStop[p[k]] {
					k++
				}
			}
			if j.keep {
				j.keepBytes(p[i:min(k+1, len(p))])
			}
			if k == len(p) {
				return
			}
			i = k
			switch {
			case j.esc:
				j.esc = false
			case p[k] == '\\':
				j.esc = true
			case j.state == jString:
				j.endValue()
			default:
				j.state = jNested
			}
		case jNested:
			// The bulk of an answer (choices, text) is here: skip quickly
			// to the next byte that matters.
			k := i
			for k < len(p) && !nestedStop[p[k]] {
				k++
			}
			if j.keep {
				j.keepBytes(p[i:min(k+1, len(p))])
			}
			if k == len(p) {
				return
			}
			i = k
			switch p[k] {
			case '"':
				j.state = jNestedStr
			case '{', '[':
				j.depth++
			default:
				if j.depth--; j.depth == 0 {
					j.endValue()
				}
			}
		case jScalar:
			if isSpace(c) || c == ',' || c == '}' {
				j.endValue()
				i-- // the byte belongs to what follows the value
				continue
			}
			if j.keep {
				j.keepByte(c)
			}
		case jAfterValue:
			switch {
			case isSpace(c):
			case c == ',':
				j.state = jKey
			default: // '}' or not JSON
				j.state = jDone
			}
		case jDone:
			return
		}
	}
}

func (j *jsonUsage) keepByte(c byte) {
	if j.keep && len(j.val) < maxUsageBytes {
		j.val = append(j.val, c)
	}
}

func (j *jsonUsage) keepBytes(b []byte) {
	if j.keep && len(j.val)+len(b) <= maxUsageBytes {
		j.val = append(j.val, b...)
	} else if j.keep {
		j.val = append(j.val[:0], 'x') // too long: make it fail to decode
		j.keep = false
	}
}

// endValue ends a top-level value, decoding it when it was usage's.
func (j *jsonUsage) endValue() {
	j.state = jAfterValue
	if !j.keep {
		return
	}
	j.keep = false
	if string(j.val) == "null" { // OpenAI's chunks before the last
		return
	}
	var u openai.Usage
	if json.Unmarshal(j.val, &u) == nil {
		j.found, j.usage = true, u
	}
}

// sseUsage splits an event stream into events, counts those with data and
// reads the usage in their data.
type sseUsage struct {
	state  uint8
	cr     bool // the last line ended with '\r': a '\n' next is part of it
	field  [5]byte
	fieldN int
	data   bool // the event being read has a data field
	events int  // events dispatched that had data
	js     jsonUsage

	found bool
	usage openai.Usage
}

const (
	sLineStart  uint8 = iota // at the start of a line: a field name or a blank line
	sField                   // in a field name
	sValueStart              // just after "name:": one space is skipped
	sData                    // in a data field's value
	sSkip                    // in another field's value, or a comment
)

// write feeds the next bytes of the stream.
func (s *sseUsage) write(p []byte) {
	for i := 0; i < len(p); i++ {
		c := p[i]
		if s.cr {
			s.cr = false
			if c == '\n' {
				continue
			}
		}
		if c == '\r' || c == '\n' {
			s.cr = c == '\r'
			s.endLine()
			continue
		}
		switch s.state {
		case sLineStart:
			if c == ':' {
				s.state = sSkip // a comment
				continue
			}
			s.state, s.fieldN = sField, 0
			fallthrough
		case sField:
			if c == ':' {
				s.state = sSkip
				if s.fieldN == 4 && string(s.field[:4]) == "data" {
					s.startData()
					s.state = sValueStart
				}
				continue
			}
			if s.fieldN < len(s.field) {
				s.field[s.fieldN] = c
			}
			s.fieldN++
		case sValueStart:
			s.state = sData
			if c == ' ' {
				continue
			}
			fallthrough
		case sData:
			k := i + lineEnd(p[i:])
			s.js.write(p[i:k])
			i = k - 1
		case sSkip:
			i += lineEnd(p[i:]) - 1
		}
	}
}

// lineEnd is the index of the first '\n' or '\r' in p, or len(p).
func lineEnd(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	if n < 0 {
		n = len(p)
	}
	if r := bytes.IndexByte(p[:n], '\r'); r >= 0 {
		return r
	}
	return n
}

// startData begins a data field: the first of an event starts its JSON,
// a later one continues it after a newline (data fields join with "\n").
func (s *sseUsage) startData() {
	if s.data {
		s.js.write([]byte{'\n'})
		return
	}
	s.data = true
	s.js.reset()
}

func (s *sseUsage) endLine() {
	switch s.state {
	case sLineStart: // a blank line dispatches the event
		if s.data {
			s.events++
			if s.js.found {
				s.found, s.usage = true, s.js.usage
			}
		}
		s.data = false
	case sField:
		if s.fieldN == 4 && string(s.field[:4]) == "data" { // "data" alone: empty data
			s.startData()
		}
	}
	s.state = sLineStart
}

// answerUsage reads an answer's usage as it is written: a stream's
// events or a plain answer's JSON body.
type answerUsage struct {
	sse  bool
	body jsonUsage
	ev   sseUsage
	// counted, when set, is the usage the engine sent beside the answer
	// (engineapi.UsageTrailer); it wins over what the answer says.
	counted *openai.Usage
}

func (a *answerUsage) write(p []byte) {
	if a.sse {
		a.ev.write(p)
	} else {
		a.body.write(p)
	}
}

// events is the number of SSE events with data written (0 for a plain
// answer).
func (a *answerUsage) events() int {
	if a.sse {
		return a.ev.events
	}
	return 0
}

// result is the usage read, and whether there was one.
func (a *answerUsage) result() (openai.Usage, bool) {
	if a.counted != nil {
		return *a.counted, true
	}
	if a.sse {
		return a.ev.usage, a.ev.found
	}
	return a.body.usage, a.body.found
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	const want = "text/event-stream"
	if len(ct) < len(want) {
		return false
	}
	for i := range len(want) {
		c := ct[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != want[i] {
			return false
		}
	}
	return len(ct) == len(want) || ct[len(want)] == ';' || ct[len(want)] == ' '
}
