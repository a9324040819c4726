package sample

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// truncateAtStop is the reference: a stream stops at the first chunk after
// which the text so far contains a stop string, and ends just before the
// earliest-starting stop string in that text. It returns the text to emit
// and the chunk index of the stop (-1 for none).
func truncateAtStop(chunks, stops []string) (string, int) {
	text := ""
	for i, c := range chunks {
		text += c
		cut := -1
		for _, s := range stops {
			if s == "" {
				continue
			}
			if j := strings.Index(text, s); j >= 0 && (cut < 0 || j < cut) {
				cut = j
			}
		}
		if cut >= 0 {
			return text[:cut], i
		}
	}
	return text, -1
}

// runMatcher feeds chunks and returns each Add's emit, whether and at which
// chunk it stopped, and the Flush at the end.
func runMatcher(stops, chunks []string) (emits []string, stoppedAt int, flush string) {
	m := NewStopMatcher(stops)
	stoppedAt = -1
	for i, c := range chunks {
		e, stopped := m.Add(c)
		emits = append(emits, e)
		if stopped && stoppedAt < 0 {
			stoppedAt = i
		}
	}
	return emits, stoppedAt, m.Flush()
}

func TestStopMatcher(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stops     []string
		chunks    []string
		emits     []string
		stoppedAt int // chunk index of the stop, -1 for none
		flush     string
	}{
		{"no stops", nil, []string{"ab", "cd"}, []string{"ab", "cd"}, -1, ""},
		{"empty stop ignored", []string{""}, []string{"ab"}, []string{"ab"}, -1, ""},
		{"no match", []string{"END"}, []string{"abc", "def"}, []string{"abc", "def"}, -1, ""},
		{"inside one chunk", []string{"END"}, []string{"abcENDxyz", "more"}, []string{"abc", ""}, 0, ""},
		{"at the very start", []string{"END"}, []string{"END"}, []string{""}, 0, ""},
		{"spanning two chunks", []string{"world"}, []string{"hello wo", "rld!"}, []string{"hello ", ""}, 1, ""},
		{"spanning three chunks", []string{"<|end|>"}, []string{"a<", "|e", "nd|>b"}, []string{"a", "", ""}, 2, ""},
		{"earliest of two in one chunk", []string{"xyz", "abc"}, []string{"..abc..xyz"}, []string{".."}, 0, ""},
		{"earliest start wins across chunks", []string{"d", "bcd"}, []string{"ab", "cd"}, []string{"a", ""}, 1, ""},
		{"a completed stop beats a longer one still open", []string{"abcd", "c"}, []string{"abc", "d"}, []string{"ab", ""}, 0, ""},
		{"both complete in one chunk: earliest start", []string{"abcd", "c"}, []string{"abcd"}, []string{""}, 0, ""},
		{"false start emitted later", []string{"STOP"}, []string{"xST", "ART more"}, []string{"x", "START more"}, -1, ""},
		{"false start held to the end", []string{"STOP"}, []string{"abc S", "TO"}, []string{"abc ", ""}, -1, "STO"},
		{"overlapping self prefix", []string{"aab"}, []string{"aa", "aab"}, []string{"", "aa"}, 1, ""},
		{"stop after stop ignored", []string{"!"}, []string{"hi!", "there!"}, []string{"hi", ""}, 0, ""},
		{"multibyte stop across chunks", []string{"。終"}, []string{"日本語。", "終わり"}, []string{"日本語", ""}, 1, ""},
		{"multibyte near miss", []string{"é!"}, []string{"cafè", "!é", "?"}, []string{"cafè", "!", "é?"}, -1, ""},
		{"emoji", []string{"🙂🙂"}, []string{"ok 🙂", " 🙂", "🙂 done"}, []string{"ok ", "🙂 ", ""}, 2, ""},
	} {
		emits, stoppedAt, flush := runMatcher(tc.stops, tc.chunks)
		if !slices.Equal(emits, tc.emits) || stoppedAt != tc.stoppedAt || flush != tc.flush {
			t.Errorf("%s: emits %q, stopped at %d, flush %q; want %q, %d, %q",
				tc.name, emits, stoppedAt, flush, tc.emits, tc.stoppedAt, tc.flush)
		}
		for _, e := range emits {
			if !utf8.ValidString(e) {
				t.Errorf("%s: emitted invalid UTF-8 %q", tc.name, e)
			}
		}
		got := strings.Join(emits, "") + flush
		want, wantAt := truncateAtStop(tc.chunks, tc.stops)
		if got != want || stoppedAt != wantAt {
			t.Errorf("%s: emits+flush = %q (stopped at %d), reference %q (stopped at %d)", tc.name, got, stoppedAt, want, wantAt)
		}
	}
}

// TestStopMatcherRandom checks emits+Flush == the input truncated at the
// first stop, over random texts, stops and chunkings.
func TestStopMatcherRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "c", "é", "語", "🙂"}
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for trial := range 3000 {
		text := word(r.IntN(40))
		var stops []string
		for range 1 + r.IntN(3) {
			stops = append(stops, word(1+r.IntN(4)))
		}
		var chunks []string
		for rest := text; rest != ""; {
			n := min(1+r.IntN(6), len(rest))
			chunks = append(chunks, rest[:n]) // byte chunks: may split runes
			rest = rest[n:]
		}
		emits, stoppedAt, flush := runMatcher(stops, chunks)
		got := strings.Join(emits, "") + flush
		want, wantAt := truncateAtStop(chunks, stops)
		if got != want || stoppedAt != wantAt {
			t.Fatalf("trial %d: text %q stops %q chunks %q: got %q (stopped at %d), want %q (stopped at %d)",
				trial, text, stops, chunks, got, stoppedAt, want, wantAt)
		}
		if stoppedAt >= 0 {
			if flush != "" {
				t.Fatalf("trial %d: Flush after a stop returned %q", trial, flush)
			}
			for _, e := range emits[stoppedAt+1:] {
				if e != "" {
					t.Fatalf("trial %d: emitted %q after the stop", trial, e)
				}
			}
		}
	}
}
