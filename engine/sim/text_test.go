package sim

import (
	"fmt"
	"strings"
	"testing"
	"unicode"
)

func text(seed uint64, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(Word(seed, i))
	}
	return b.String()
}

func TestWordDeterministic(t *testing.T) {
	for _, seed := range []uint64{0, 1, 42, 1 << 63, ^uint64(0)} {
		forward := make([]string, 300)
		for i := range forward {
			forward[i] = Word(seed, i)
		}
		if got := text(seed, 300); got != strings.Join(forward, "") {
			t.Fatalf("seed %d: text changed between calls:\n%s\n%s", seed, strings.Join(forward, ""), got)
		}
		// Backwards, with other seeds' words in between, every position
		// gives what the forward pass gave: nothing depends on history.
		for i := 299; i >= 0; i -= 7 {
			Word(seed+1, 299-i)
			Word(^seed, 3*i+1)
			if got := Word(seed, i); got != forward[i] {
				t.Errorf("seed %d position %d: %q out of order, %q in order", seed, i, got, forward[i])
			}
		}
	}
	// Pinned words, including a position far past any context: a change to
	// the hash, the templates or the word lists shows here.
	for _, tc := range []struct {
		seed     uint64
		position int
		want     string
	}{
		{0, 0, "Others"},
		{0, 7, " door."},
		{1, 8, " Perhaps"},
		{42, 1000, " but"},
		{1 << 63, 4095, " ask."},
		{^uint64(0), 123457, " play"},
		{3, 1 << 40, " You"},
	} {
		if got := Word(tc.seed, tc.position); got != tc.want {
			t.Errorf("Word(%d, %d) = %q, want %q", tc.seed, tc.position, got, tc.want)
		}
	}
}

func TestWordDifferentSeedsDiffer(t *testing.T) {
	pairs := [][2]uint64{{0, 1}, {1, 2}, {42, 43}, {7, 7 << 32}, {0, ^uint64(0)}}
	for _, pair := range pairs {
		a, b := pair[0], pair[1]
		if text(a, 50) == text(b, 50) {
			t.Errorf("seeds %d and %d give the same text", a, b)
		}
		same := 0
		for i := range 200 {
			if Word(a, i) == Word(b, i) {
				same++
			}
		}
		if same > 40 {
			t.Errorf("seeds %d and %d agree on %d of 200 words, want them mostly different", a, b, same)
		}
	}
}

func TestWordReadsLikeText(t *testing.T) {
	known := map[string]bool{"an": true}
	for _, words := range classWords {
		for _, w := range words {
			known[w] = true
		}
	}
	for _, seed := range []uint64{3, 99, 123456789} {
		const n = 2000
		distinct := map[string]bool{}
		sentences := 0
		prevEnded := true
		prevCore := ""
		for i := range n {
			w := Word(seed, i)
			if i == 0 && strings.HasPrefix(w, " ") {
				t.Errorf("seed %d: position 0 %q starts with a space", seed, w)
			}
			if i > 0 && !strings.HasPrefix(w, " ") {
				t.Errorf("seed %d position %d: %q does not start with a space", seed, i, w)
			}
			bare := strings.TrimLeft(w, " ")
			core := strings.TrimRight(bare, ".,?")
			if core == "" {
				t.Fatalf("seed %d position %d: empty word %q", seed, i, w)
			}
			punct := bare[len(core):]
			if len(punct) > 1 {
				t.Errorf("seed %d position %d: %q has more than one punctuation mark", seed, i, w)
			}
			if punct != "" && i%phraseLen != phraseLen-1 {
				t.Errorf("seed %d position %d: %q is punctuated inside a phrase", seed, i, w)
			}
			if capital := unicode.IsUpper(rune(core[0])); capital != prevEnded {
				t.Errorf("seed %d position %d: %q capitalised=%v, want %v", seed, i, w, capital, prevEnded)
			}
			lower := strings.ToLower(core)
			if !known[lower] {
				t.Errorf("seed %d position %d: %q is not in the word lists", seed, i, w)
			}
			switch strings.ToLower(prevCore) {
			case "a":
				if startsWithVowel(lower) {
					t.Errorf("seed %d position %d: \"a %s\", want \"an\"", seed, i, lower)
				}
			case "an":
				if !startsWithVowel(lower) {
					t.Errorf("seed %d position %d: \"an %s\", want \"a\"", seed, i, lower)
				}
			}
			distinct[lower] = true
			prevEnded = punct == "." || punct == "?"
			prevCore = core
			if prevEnded {
				sentences++
			}
		}
		if sentences < n/40 || sentences > n/5 {
			t.Errorf("seed %d: %d sentence ends in %d words, want ordinary sentence lengths (5-40 words)", seed, sentences, n)
		}
		if len(distinct) < 200 {
			t.Errorf("seed %d: only %d distinct words in %d", seed, len(distinct), n)
		}
	}
}

func TestWordNegativePosition(t *testing.T) {
	for _, pos := range []int{-1, -1000} {
		if got, want := Word(5, pos), Word(5, 0); got != want {
			t.Errorf("Word(5, %d) = %q, want Word(5, 0) = %q", pos, got, want)
		}
	}
}

func TestWordListsHaveNoDuplicates(t *testing.T) {
	total := 0
	for class, words := range classWords {
		if len(words) == 0 {
			t.Errorf("word class %d has no words", class)
		}
		seen := map[string]bool{}
		for _, w := range words {
			if seen[w] {
				t.Errorf("word %q listed twice in class %d", w, class)
			}
			if w == "" || strings.ToLower(w) != w || strings.ContainsAny(w, " .,?") {
				t.Errorf("word %q is not a bare lower-case word", w)
			}
			seen[w] = true
		}
		total += len(words)
	}
	if total < 300 {
		t.Errorf("%d words, want a few hundred", total)
	}
	for i, tmpl := range templates {
		if tmpl[phraseLen-1] == det {
			t.Errorf("template %d ends with a determiner", i)
		}
	}
}

func ExampleWord() {
	for i := range 16 {
		fmt.Print(Word(7, i))
	}
	fmt.Println()
	// Output: Of this cold song we must open together already many miss their full journey with man,
}

func BenchmarkWord(b *testing.B) {
	n := 0
	for i := 0; b.Loop(); i++ {
		n += len(Word(uint64(i>>10), i))
	}
	_ = n
}
