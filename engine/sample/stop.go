package sample

import "strings"

// StopMatcher watches streamed text for stop strings that may span token
// boundaries. Add returns the text that is safe to emit now (holding back
// any suffix that could be the start of a stop string) and whether a stop
// string completed; on a stop the text up to (not including) the stop
// string is returned and nothing after it. Flush returns held-back text
// when the stream ends without a stop. When several stop strings complete
// in the same Add, the one that starts earliest wins.
//
// A StopMatcher serves one request and is not safe for concurrent use.
type StopMatcher struct {
	stops   []string
	held    string // text received but not yet emitted
	stopped bool
}

// NewStopMatcher watches for stops; empty strings among them are ignored,
// and with none left every Add emits its text at once.
func NewStopMatcher(stops []string) *StopMatcher {
	m := &StopMatcher{}
	for _, s := range stops {
		if s != "" {
			m.stops = append(m.stops, s)
		}
	}
	return m
}

// Add takes the next piece of streamed text. After a stop it returns
// ("", true) and ignores the text.
func (m *StopMatcher) Add(text string) (emit string, stopped bool) {
	if m.stopped {
		return "", true
	}
	if len(m.stops) == 0 {
		return text, false
	}
	buf := m.held + text
	// held cannot contain a whole stop string (it would have matched when
	// it arrived), so any match now ends in the new text.
	cut := -1
	for _, s := range m.stops {
		from := max(len(m.held)-len(s)+1, 0)
		i := strings.Index(buf[from:], s)
		if i >= 0 && (cut < 0 || from+i < cut) {
			cut = from + i
		}
	}
	if cut >= 0 {
		m.stopped, m.held = true, ""
		return buf[:cut], true
	}
	keep := m.pending(buf)
	m.held = buf[keep:]
	return buf[:keep], false
}

// pending returns where the longest suffix of buf that is a proper prefix
// of some stop string starts (len(buf) when there is none).
func (m *StopMatcher) pending(buf string) int {
	longest := 0
	for _, s := range m.stops {
		start := max(len(buf)-len(s)+1, 0)
		for i := start; i < len(buf); i++ {
			if len(buf)-i <= longest {
				break
			}
			if strings.HasPrefix(s, buf[i:]) {
				longest = len(buf) - i
				break
			}
		}
	}
	return len(buf) - longest
}

// Flush returns the held-back text at the end of a stream that did not
// stop, and empties the matcher's buffer.
func (m *StopMatcher) Flush() string {
	h := m.held
	m.held = ""
	return h
}
