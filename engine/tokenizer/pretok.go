package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites the text between added tokens before pre-tokenisation.
// A non-nil error (a regex that ran past RegexMatchTimeout) fails the
// encode.
type normalizer interface {
	normalize(s string) (string, error)
}

type normSequence []normalizer

func (n normSequence) normalize(s string) (string, error) {
	for _, x := range n {
		var err error
		if s, err = x.normalize(s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// normPrepend adds a prefix to non-empty text (SentencePiece's "▁").
type normPrepend struct{ prefix string }

func (n normPrepend) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return n.prefix + s, nil
}

// normReplace replaces a literal string or regex match with content.
type normReplace struct {
	literal string
	re      *regexp2.Regexp
	content string
}

func (n normReplace) normalize(s string) (string, error) {
	if n.re == nil {
		return strings.ReplaceAll(s, n.literal, n.content), nil
	}
	out, err := n.re.ReplaceFunc(s, func(regexp2.Match) string { return n.content }, -1, -1)
	if err != nil {
		return s, regexError(err)
	}
	return out, nil
}

type normLowercase struct{}

func (normLowercase) normalize(s string) (string, error) { return strings.ToLower(s), nil }

type normUnicode struct{ form norm.Form }

func (n normUnicode) normalize(s string) (string, error) { return n.form.String(s), nil }

type normStrip struct{ left, right bool }

func (n normStrip) normalize(s string) (string, error) {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s, nil
}

// piece is a pre-token in the making; atStart marks text that begins at the
// start of the input (Metaspace's prepend_scheme "first" needs it).
type piece struct {
	s       string
	atStart bool
	// err, shared by all the pieces of one encode, receives the first
	// regex engine error (a match that ran past RegexMatchTimeout); nil
	// when the caller does not collect errors.
	err *error
}

// preTokenizer splits one piece into pieces, handing each to emit in order.
// Pieces stream through a chain of pre-tokenizers into the model without
// being collected, which keeps long inputs cheap.
type preTokenizer interface {
	split(p piece, emit func(piece))
}

type preSequence []preTokenizer

func (q preSequence) split(p piece, emit func(piece)) {
	if len(q) == 0 {
		emit(p)
		return
	}
	stages := make([]func(piece), len(q))
	next := emit
	for i := len(q) - 1; i >= 0; i-- {
		step, out := q[i], next
		stages[i] = func(x piece) { step.split(x, out) }
		next = stages[i]
	}
	stages[0](p)
}

// behavior says what happens to the matches of a Split.
type behavior uint8

const (
	behaviorRemoved behavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

func parseBehavior(s string) (behavior, bool) {
	switch s {
	case "Removed":
		return behaviorRemoved, true
	case "Isolated":
		return behaviorIsolated, true
	case "MergedWithPrevious":
		return behaviorMergedWithPrevious, true
	case "MergedWithNext":
		return behaviorMergedWithNext, true
	case "Contiguous":
		return behaviorContiguous, true
	}
	return 0, false
}

// cutter cuts a piece along a stream of matches the way the tokenizers
// library's SplitDelimiterBehavior does: feed matches left to right with
// match, then call finish.
type cutter struct {
	p      piece
	b      behavior
	invert bool
	emit   func(piece)

	last int // end of the last region fed

	// A region not emitted yet because the next one may join it.
	pendStart, pendEnd int
	pendMatch          bool
	hasPend            bool
	prevMatch          bool
}

func (c *cutter) out(start, end int) {
	if end > start {
		c.emit(piece{c.p.s[start:end], c.p.atStart && start == 0, c.p.err})
	}
}

// match feeds the match [start, end); empty matches are ignored.
func (c *cutter) match(start, end int) {
	if end <= start {
		return
	}
	if start > c.last {
		c.region(c.last, start, false)
	}
	c.region(start, end, true)
	c.last = end
}

// finish feeds the text after the last match and flushes.
func (c *cutter) finish() {
	if c.last < len(c.p.s) {
		c.region(c.last, len(c.p.s), false)
		c.last = len(c.p.s)
	}
	if c.hasPend {
		c.out(c.pendStart, c.pendEnd)
		c.hasPend = false
	}
}

func (c *cutter) region(start, end int, isMatch bool) {
	if c.invert {
		isMatch = !isMatch
	}
	switch c.b {
	case behaviorRemoved:
		if !isMatch {
			c.out(start, end)
		}
	case behaviorIsolated:
		c.out(start, end)
	case behaviorMergedWithPrevious:
		// A match joins the region before it unless that was a match too.
		if isMatch && !c.prevMatch && c.hasPend {
			c.pendEnd = end
		} else {
			if c.hasPend {
				c.out(c.pendStart, c.pendEnd)
			}
			c.pendStart, c.pendEnd, c.hasPend = start, end, true
		}
	case behaviorMergedWithNext:
		// A match joins the region after it unless that is a match too.
		if isMatch {
			if c.hasPend {
				c.out(c.pendStart, c.pendEnd)
			}
			c.pendStart, c.pendEnd, c.hasPend = start, end, true
		} else if c.hasPend {
			c.out(c.pendStart, end)
			c.hasPend = false
		} else {
			c.out(start, end)
		}
	case behaviorContiguous:
		if isMatch == c.prevMatch && c.hasPend {
			c.pendEnd = end
		} else {
			if c.hasPend {
				c.out(c.pendStart, c.pendEnd)
			}
			c.pendStart, c.pendEnd, c.hasPend = start, end, true
		}
	}
	c.prevMatch = isMatch
}

// preSplit is the Split pre-tokenizer (and the regex part of ByteLevel).
type preSplit struct {
	literal  string
	re       *regexp2.Regexp
	behavior behavior
	invert   bool
}

func (q *preSplit) split(p piece, emit func(piece)) {
	if p.s == "" {
		return
	}
	c := cutter{p: p, b: q.behavior, invert: q.invert, emit: emit}
	switch {
	case q.re != nil:
		s := p.s
		runes := []rune(s)
		rpos, bpos := 0, 0
		// advance converts a rune index (regexp2 works on runes) to a byte
		// offset; matches arrive in order, so it only moves forward.
		advance := func(r int) int {
			for rpos < r {
				if s[bpos] < utf8.RuneSelf {
					bpos++
				} else {
					_, size := utf8.DecodeRuneInString(s[bpos:])
					bpos += size
				}
				rpos++
			}
			return bpos
		}
		// On an engine error (a match past RegexMatchTimeout) the rest stays
		// one region — better a coarse split than lost text — and the error
		// goes to p.err, failing EncodeChecked.
		err := q.re.FindRunesMatches(runes, 0, func(v regexp2.MatchView) bool {
			idx, n, ok := v.GroupRange(0)
			if ok && n > 0 {
				start := advance(idx)
				c.match(start, advance(idx+n))
			}
			return true
		})
		if err != nil && p.err != nil && *p.err == nil {
			*p.err = regexError(err)
		}
	case q.literal != "":
		for off := 0; ; {
			i := strings.Index(p.s[off:], q.literal)
			if i < 0 {
				break
			}
			c.match(off+i, off+i+len(q.literal))
			off += i + len(q.literal)
		}
	}
	c.finish()
}

// preFunc splits on characters selected by a predicate (Digits,
// Punctuation, WhitespaceSplit): each such character is a match.
type preFunc struct {
	f        func(rune) bool
	behavior behavior
}

func (q preFunc) split(p piece, emit func(piece)) {
	if p.s == "" {
		return
	}
	c := cutter{p: p, b: q.behavior, emit: emit}
	for i := 0; i < len(p.s); {
		r, size := utf8.DecodeRuneInString(p.s[i:])
		if q.f(r) {
			c.match(i, i+size)
		}
		i += size
	}
	c.finish()
}

// preByteLevel is the ByteLevel pre-tokenizer. Mapping bytes to the GPT-2
// alphabet happens in the model (which works on raw bytes), so here it only
// adds the prefix space and applies the GPT-2 split.
type preByteLevel struct {
	addPrefixSpace bool
	regex          *preSplit // nil unless use_regex
}

func (q preByteLevel) split(p piece, emit func(piece)) {
	if q.addPrefixSpace && p.s != "" && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	if q.regex == nil {
		if p.s != "" {
			emit(p)
		}
		return
	}
	q.regex.split(p, emit)
}

// prependScheme says when Metaspace adds the replacement in front.
type prependScheme uint8

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// preMetaspace is the Metaspace pre-tokenizer: spaces become the
// replacement character, which also starts every pre-token.
type preMetaspace struct {
	replacement string
	scheme      prependScheme
	splitAll    bool // split into one pre-token per replacement
}

func (q preMetaspace) split(p piece, emit func(piece)) {
	s := strings.ReplaceAll(p.s, " ", q.replacement)
	if s != "" && !strings.HasPrefix(s, q.replacement) &&
		(q.scheme == prependAlways || (q.scheme == prependFirst && p.atStart)) {
		s = q.replacement + s
	}
	p.s = s
	if s == "" {
		return
	}
	if !q.splitAll {
		emit(p)
		return
	}
	sp := preSplit{literal: q.replacement, behavior: behaviorMergedWithNext}
	sp.split(p, emit)
}

func isSpace(r rune) bool { return unicode.IsSpace(r) }

func isNumber(r rune) bool { return unicode.IsNumber(r) }

func isPunct(r rune) bool {
	if r < 0x80 && unicode.IsSymbol(r) {
		return true
	}
	return unicode.IsPunct(r)
}
