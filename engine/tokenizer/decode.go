package tokenizer

import (
	"bytes"
	"strings"
)

// decStepKind is one per-token step of a decoder chain.
type decStepKind uint8

const (
	decByteLevel decStepKind = iota
	decReplace
	decByteFallback
	decStrip
	decMetaspace
)

// decStep is one compiled decoder of tokenizer.json's decoder chain.
type decStep struct {
	kind decStepKind
	// from/to: Replace pattern and content; Metaspace replacement in from.
	from, to string
	// Strip: content removed up to start times in front, stop times behind.
	content     string
	start, stop int
	// Metaspace: drop the replacement from the first token.
	stripFirst bool
}

// decoderPlan is tokenizer.json's decoder compiled into per-token steps
// followed by a strip of the whole text (a Strip after Fuse). Token bytes
// are concatenated and read as UTF-8, each invalid subpart becoming U+FFFD.
type decoderPlan struct {
	steps []decStep
	// joinSpace: no decoder, so tokens are joined with single spaces.
	joinSpace bool
	// lead/trail: a Strip after Fuse, applied to the whole text.
	lead       string
	leadCount  int
	trail      string
	trailCount int
}

// tokenBytes appends the decoded bytes of token tok, the index-th token of
// the output, to dst.
func (p *decoderPlan) tokenBytes(dst []byte, tok string, index int) []byte {
	start := len(dst)
	dst = append(dst, tok...)
	var scratch []byte
	for i := range p.steps {
		st := &p.steps[i]
		cur := dst[start:]
		switch st.kind {
		case decByteLevel:
			out, ok := byteLevel.decode(scratch[:0], string(cur))
			if ok {
				scratch = out
				dst = append(dst[:start], out...)
			}
		case decReplace:
			if st.from != "" && bytes.Contains(cur, []byte(st.from)) {
				r := bytes.ReplaceAll(cur, []byte(st.from), []byte(st.to))
				dst = append(dst[:start], r...)
			}
		case decByteFallback:
			if b, ok := parseByteToken(string(cur)); ok {
				dst = append(dst[:start], b)
			}
		case decStrip:
			s := string(cur)
			for n := 0; n < st.start && st.content != "" && strings.HasPrefix(s, st.content); n++ {
				s = s[len(st.content):]
			}
			for n := 0; n < st.stop && st.content != "" && strings.HasSuffix(s, st.content); n++ {
				s = s[:len(s)-len(st.content)]
			}
			dst = append(dst[:start], s...)
		case decMetaspace:
			to := " "
			if index == 0 && st.stripFirst {
				to = ""
			}
			if st.from != "" && bytes.Contains(cur, []byte(st.from)) {
				r := bytes.ReplaceAll(cur, []byte(st.from), []byte(to))
				dst = append(dst[:start], r...)
			}
		}
	}
	return dst
}

// parseByteToken reads a byte-fallback token "<0xNN>".
func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexDigit(s[3])
	lo, ok2 := hexDigit(s[4])
	if !ok1 || !ok2 {
		return 0, false
	}
	return hi<<4 | lo, true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// Decode turns ids into text. With skipSpecial, special added tokens (BOS,
// EOS, chat markers) are left out. Ids outside the vocabulary are ignored.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	d := t.NewStreamDecoder(skipSpecial)
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(d.Add(id))
	}
	sb.WriteString(d.Flush())
	return sb.String()
}

// TokenBytes returns the raw bytes id stands for in decoded text, as the
// decoder's per-token steps produce them: a byte-fallback token "<0xE2>"
// is the one byte 0xE2, a byte-level "Ġthe" or a SentencePiece "▁the" is
// " the", an added token is its content. Unlike Decode of the id alone,
// bytes that are not valid UTF-8 stay as they are (no U+FFFD) and nothing
// is stripped (the space a decoder drops at the start of a text stays). It
// is nil for an id outside the vocabulary.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.idToToken) || !t.hasToken[id] {
		return nil
	}
	tok := t.idToToken[id]
	// Index 1: a token in the middle of a text, so a Metaspace decoder
	// keeps its leading space.
	return t.dec.tokenBytes(make([]byte, 0, len(tok)), tok, 1)
}

// StreamDecoder turns generated ids into text incrementally. Add returns only
// newly completed text and never a partial UTF-8 sequence; Flush returns the
// rest. Concatenating every result equals Decode of all ids. A StreamDecoder
// is used by one goroutine at a time.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	n           int    // tokens decoded so far
	pending     []byte // bytes of an unfinished character
	leadLeft    int    // leading strips still allowed
	held        string // trailing text that a final strip may remove
	scratch     []byte
	out         []byte
}

// NewStreamDecoder starts incremental decoding; skipSpecial as in Decode.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: skipSpecial, leadLeft: t.dec.leadCount}
}

// Add decodes one more id and returns the text it completes (often "" while
// a multi-byte character is still arriving).
func (d *StreamDecoder) Add(id int32) string {
	t := d.t
	if id < 0 || int(id) >= len(t.idToToken) || !t.hasToken[id] {
		return ""
	}
	if d.skipSpecial && t.special[id] {
		return ""
	}
	if t.dec.joinSpace && d.n > 0 {
		d.pending = append(d.pending, ' ')
	}
	d.pending = t.dec.tokenBytes(d.pending, t.idToToken[id], d.n)
	d.n++
	return d.drain(false)
}

// Flush returns whatever text is still held back, with bytes that never
// completed a character shown as U+FFFD, and resets the decoder's buffer.
func (d *StreamDecoder) Flush() string {
	return d.drain(true)
}

func (d *StreamDecoder) drain(final bool) string {
	var used int
	d.out, used = appendValidUTF8(d.out[:0], d.pending, final)
	n := copy(d.pending, d.pending[used:])
	d.pending = d.pending[:n]
	text := string(d.out)
	pl := &d.t.dec
	if d.leadLeft > 0 && pl.lead != "" {
		for d.leadLeft > 0 && strings.HasPrefix(text, pl.lead) {
			text = text[len(pl.lead):]
			d.leadLeft--
		}
		if text != "" {
			d.leadLeft = 0
		}
	}
	if pl.trailCount > 0 && pl.trail != "" {
		text = d.held + text
		cut := len(text)
		for k := 0; k < pl.trailCount && strings.HasSuffix(text[:cut], pl.trail); k++ {
			cut -= len(pl.trail)
		}
		d.held = text[cut:]
		text = text[:cut]
		if final {
			d.held = ""
		}
	}
	return text
}
