package tokenizer

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// benchText is about size bytes of English-like text: corpus words shuffled
// with a fixed seed, with some numbers, punctuation and non-ASCII mixed in.
func benchText(size int) string {
	words := strings.Fields(synthCorpus)
	rng := rand.New(rand.NewPCG(9, 9))
	extras := []string{"1234", "3.14", "—", "naïve", "日本", "🙂", "don't", "(x)", "\n\n"}
	var sb strings.Builder
	for sb.Len() < size {
		if rng.IntN(20) == 0 {
			sb.WriteString(extras[rng.IntN(len(extras))])
		} else {
			sb.WriteString(words[rng.IntN(len(words))])
		}
		if rng.IntN(12) == 0 {
			sb.WriteString(".\n")
		} else {
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}

func BenchmarkEncode(b *testing.B) {
	text := benchText(300 << 10)
	for _, k := range []struct {
		name string
		tk   func(testing.TB) *Tokenizer
	}{
		{"bytelevel-32000", func(tb testing.TB) *Tokenizer { return newSynth(tb, 32000) }},
		{"bytelevel-128256", func(tb testing.TB) *Tokenizer { return newSynth(tb, 128256) }},
		{"sentencepiece", func(tb testing.TB) *Tokenizer { return newSP(tb, spOptions{}, "") }},
	} {
		b.Run(k.name, func(b *testing.B) {
			tk := k.tk(b)
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for b.Loop() {
				tk.Encode(text, true)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	text := benchText(300 << 10)
	tk := newSynth(b, 32000)
	ids := tk.Encode(text, false)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for b.Loop() {
		tk.Decode(ids, false)
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", "hello world", " a\n\nb ", "é🙂中", "\u0000\t", "it's 12345"} {
		f.Add(s)
	}
	kinds := []*Tokenizer{newSynth(f, 1000), newSP(f, spOptions{}, "")}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || strings.Contains(s, "<") || strings.Contains(s, "▁") {
			return
		}
		for _, tk := range kinds {
			if got := tk.Decode(tk.Encode(s, true), true); got != s {
				t.Fatalf("round trip %q -> %q", s, got)
			}
		}
	})
}

func BenchmarkSynthesize(b *testing.B) {
	for _, n := range []int{32000, 128256} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				if _, _, err := Synthesize(n, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNew measures loading a tokenizer.json, part of every model load.
func BenchmarkNew(b *testing.B) {
	for _, n := range []int{32000, 128256} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			tok, cfg, err := Synthesize(n, 1)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(tok)))
			for b.Loop() {
				if _, err := New(tok, cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
