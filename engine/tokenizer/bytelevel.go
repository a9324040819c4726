package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// byteLevelAlphabet is GPT-2's reversible mapping between the 256 byte values
// and printable Unicode characters: byte-level BPE vocabularies spell every
// token with these characters (a space is "Ġ", a newline "Ċ").
type byteLevelAlphabet struct {
	toRune [256]rune
	// toByte is indexed by rune; -1 marks runes outside the alphabet.
	toByte [324]int16
}

// byteLevel is the read-only GPT-2 alphabet.
var byteLevel = newByteLevelAlphabet()

func newByteLevelAlphabet() *byteLevelAlphabet {
	a := &byteLevelAlphabet{}
	for i := range a.toByte {
		a.toByte[i] = -1
	}
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	next := rune(256)
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !printable(b) {
			r = next
			next++
		}
		a.toRune[b] = r
		a.toByte[r] = int16(b)
	}
	return a
}

// encode spells raw bytes in the byte-level alphabet.
func (a *byteLevelAlphabet) encode(raw string) string {
	var sb strings.Builder
	sb.Grow(len(raw) * 2)
	for i := 0; i < len(raw); i++ {
		sb.WriteRune(a.toRune[raw[i]])
	}
	return sb.String()
}

// appendEncoded appends raw bytes spelled in the byte-level alphabet (at
// most two bytes each) to dst.
func (a *byteLevelAlphabet) appendEncoded(dst []byte, raw string) []byte {
	for i := 0; i < len(raw); i++ {
		dst = utf8.AppendRune(dst, a.toRune[raw[i]])
	}
	return dst
}

// decode maps a byte-level spelled token back to raw bytes. ok is false when
// the token holds a character outside the alphabet (an added token written in
// plain text, for instance).
func (a *byteLevelAlphabet) decode(dst []byte, tok string) (out []byte, ok bool) {
	start := len(dst)
	for _, r := range tok {
		if r < 0 || int(r) >= len(a.toByte) || a.toByte[r] < 0 {
			return dst[:start], false
		}
		dst = append(dst, byte(a.toByte[r]))
	}
	return dst, true
}

// utf8Subpart inspects the start of b, which must not begin with a valid
// complete UTF-8 sequence. It returns the length of the maximal prefix that
// could start a valid sequence (at least 1), the unit that becomes one U+FFFD,
// and whether b ended before that could be decided (more bytes might still
// complete a character).
func utf8Subpart(b []byte) (n int, incomplete bool) {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 2
	case c == 0xE0:
		need, lo = 3, 0xA0
	case c == 0xED:
		need, hi = 3, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		need = 3
	case c == 0xF0:
		need, lo = 4, 0x90
	case c == 0xF4:
		need, hi = 4, 0x8F
	case c >= 0xF1 && c <= 0xF3:
		need = 4
	default:
		return 1, false
	}
	n = 1
	for n < need {
		if n >= len(b) {
			return n, true
		}
		x := b[n]
		if n == 1 {
			if x < lo || x > hi {
				return n, false
			}
		} else if x < 0x80 || x > 0xBF {
			return n, false
		}
		n++
	}
	// A complete valid sequence: callers only get here if they misjudged.
	return n, false
}

// appendValidUTF8 appends the text of b to dst, replacing each maximal
// invalid subpart with U+FFFD. Unless final, a trailing sequence that more
// bytes could still complete is left unconsumed. It returns the new dst and
// how many bytes of b were consumed.
func appendValidUTF8(dst []byte, b []byte, final bool) ([]byte, int) {
	i := 0
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, b[i:i+size]...)
			i += size
			continue
		}
		n, incomplete := utf8Subpart(b[i:])
		if incomplete && !final {
			break
		}
		dst = append(dst, "\uFFFD"...)
		i += n
	}
	return dst, i
}
