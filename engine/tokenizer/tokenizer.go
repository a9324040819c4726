// Package tokenizer reads Hugging Face tokenizer.json tokenizers of the
// Llama family — byte-level BPE (GPT-2, Llama 3) and SentencePiece-style BPE
// with byte fallback (Llama 2, TinyLlama) — and encodes, decodes (also
// incrementally, for streaming) and renders chat templates with them.
//
// Differences from the tokenizers library worth knowing: added tokens are
// matched on the raw text (also those marked "normalized"), a ByteLevel
// pre-tokenizer is assumed to come last in a pre-tokenizer sequence, and
// decoded bytes that are not valid UTF-8 become one U+FFFD per maximal
// invalid subpart.
package tokenizer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// ErrNoTokenizer is wrapped by Load when the directory has no
// tokenizer.json; callers then work on token ids.
var ErrNoTokenizer = errors.New("no tokenizer.json")

// Tokenizer encodes text to token ids and back. It is safe for concurrent
// use after construction.
type Tokenizer struct {
	model      *bpeModel
	added      addedMatcher
	normalizer normalizer   // nil: none
	pre        preTokenizer // nil: the whole segment is one pre-token
	dec        decoderPlan

	idToToken []string
	hasToken  []bool
	special   []bool
	tokenIDs  map[string]int32 // added tokens (by content); the model vocab is consulted after

	prefix, suffix []int32 // added around the text when Encode's addSpecial is set

	bos      int32
	hasBOS   bool
	eos      []int32
	bosToken string
	eosToken string

	chat *chatTemplate // nil: no usable template, the plain fallback is used
}

// maxTokenID bounds ids read from tokenizer.json so a corrupt file cannot
// demand a huge allocation.
const maxTokenID = 1 << 24

// The files a tokenizer is read from.
const (
	TokenizerFile    = "tokenizer.json"
	ConfigFile       = "tokenizer_config.json"
	ChatTemplateFile = "chat_template.jinja"
)

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json
// (and dir/chat_template.jinja when the config has no chat_template). Without
// tokenizer.json it returns an error wrapping ErrNoTokenizer.
func Load(dir string) (*Tokenizer, error) {
	files := map[string][]byte{}
	for _, name := range []string{TokenizerFile, ConfigFile, ChatTemplateFile} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("load tokenizer: %w", err)
		}
		files[name] = data
	}
	t, err := FromFiles(files)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer from %s: %w", dir, err)
	}
	return t, nil
}

// FromFiles builds a tokenizer from a checkpoint's files held in memory,
// by name: tokenizer.json and, when present, tokenizer_config.json and
// chat_template.jinja. Without tokenizer.json it returns an error wrapping
// ErrNoTokenizer.
func FromFiles(files map[string][]byte) (*Tokenizer, error) {
	tj, ok := files[TokenizerFile]
	if !ok {
		return nil, ErrNoTokenizer
	}
	return build(tj, files[ConfigFile], string(files[ChatTemplateFile]))
}

// New builds a tokenizer from the contents of tokenizer.json and, optionally
// (nil), tokenizer_config.json.
func New(tokenizerJSON, tokenizerConfigJSON []byte) (*Tokenizer, error) {
	return build(tokenizerJSON, tokenizerConfigJSON, "")
}

// Encode turns text into token ids. With addSpecial the tokens the
// post-processor or tokenizer_config.json asks for (typically BOS) are
// added around the text. Added tokens such as "<|eot_id|>" written in the
// text are recognised as such. A regex that runs past RegexMatchTimeout
// leaves the rest of its segment unsplit (a coarse but lossless encoding);
// use EncodeChecked to fail instead.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int32 {
	return t.encode(text, addSpecial, nil)
}

// EncodeChecked is Encode that fails, with an error wrapping
// ErrRegexLimit, when a normalizer or pre-tokenizer regex runs past
// RegexMatchTimeout on text (a pathological pattern such as `(a+)+$`): the
// input is at fault for this model, so servers answer it with a 400.
func (t *Tokenizer) EncodeChecked(text string, addSpecial bool) ([]int32, error) {
	var err error
	ids := t.encode(text, addSpecial, &err)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// encode is Encode; errp, when not nil, receives the first regex error.
func (t *Tokenizer) encode(text string, addSpecial bool, errp *error) []int32 {
	ids := make([]int32, 0, len(text)/3+len(t.prefix)+len(t.suffix)+1)
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	emit := func(p piece) { ids = t.model.encodeWord(p.s, ids) }
	pos := 0
	for {
		start, end, id := t.added.find(text, pos)
		if id < 0 {
			t.encodeSegment(text[pos:], pos == 0, &ids, emit, errp)
			break
		}
		t.encodeSegment(text[pos:start], pos == 0, &ids, emit, errp)
		if errp != nil && *errp != nil {
			return ids
		}
		ids = append(ids, id)
		pos = end
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids
}

// encodeSegment encodes text that holds no added token, appending to *ids
// (through emit when a pre-tokenizer splits it). Regex errors go to errp
// when it is not nil (and stop the segment), else they are ignored.
func (t *Tokenizer) encodeSegment(seg string, atStart bool, ids *[]int32, emit func(piece), errp *error) {
	if seg == "" {
		return
	}
	if t.normalizer != nil {
		var err error
		seg, err = t.normalizer.normalize(seg)
		if err != nil && errp != nil {
			if *errp == nil {
				*errp = err
			}
			return
		}
		if seg == "" {
			return
		}
	}
	if t.pre == nil {
		*ids = t.model.encodeWord(seg, *ids)
		return
	}
	t.pre.split(piece{seg, atStart, errp}, emit)
}

// VocabSize is the number of token ids: one more than the largest id of the
// vocabulary and the added tokens.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// TokenID looks a token up by its spelling: an added token's content or a
// vocabulary entry as written in tokenizer.json (byte-level vocabularies
// spell a space "Ġ").
func (t *Tokenizer) TokenID(token string) (int32, bool) {
	if id, ok := t.tokenIDs[token]; ok {
		return id, true
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// Token is the spelling of id as stored in tokenizer.json, "" when the id is
// unknown.
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.idToToken) {
		return ""
	}
	return t.idToToken[id]
}

// IsSpecial reports whether id is a special added token (BOS, EOS, chat
// markers), the tokens Decode's skipSpecial leaves out.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// BOS is the beginning-of-sequence token: tokenizer_config.json's bos_token,
// or else the first token the post-processor puts before the text.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.hasBOS }

// EOS lists the tokens that end generation: tokenizer_config.json's
// eos_token, the end-of-text special tokens the tokenizer has
// (<|end_of_text|>, <|endoftext|>, </s>) and the end-of-turn special tokens
// (<|eot_id|>, <|eom_id|>, <|im_end|>, ...) that the chat template names —
// all of them when there is no config. The slice is a copy.
func (t *Tokenizer) EOS() []int32 { return append([]int32(nil), t.eos...) }

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	content    string
	id         int32
	special    bool
	lstrip     bool
	rstrip     bool
	singleWord bool
}

// addedMatcher finds added tokens in text: leftmost first, longest at a
// position.
type addedMatcher struct {
	toks  []addedToken
	first [256][]int32 // indices into toks by first byte, longest first
}

func newAddedMatcher(toks []addedToken) addedMatcher {
	m := addedMatcher{toks: toks}
	for i, tk := range toks {
		if tk.content == "" {
			continue
		}
		c := tk.content[0]
		m.first[c] = append(m.first[c], int32(i))
	}
	for c := range m.first {
		l := m.first[c]
		// Insertion sort by length, longest first; ties keep file order.
		for i := 1; i < len(l); i++ {
			for j := i; j > 0 && len(toks[l[j]].content) > len(toks[l[j-1]].content); j-- {
				l[j], l[j-1] = l[j-1], l[j]
			}
		}
	}
	return m
}

// find returns the span [start, end) of the first added token at or after
// from (widened by its lstrip/rstrip whitespace) and its id, or id -1.
func (m *addedMatcher) find(text string, from int) (start, end int, id int32) {
	if len(m.toks) == 0 {
		return 0, 0, -1
	}
	for i := from; i < len(text); i++ {
		cands := m.first[text[i]]
		if len(cands) == 0 {
			continue
		}
		for _, ci := range cands {
			tk := &m.toks[ci]
			if len(text)-i < len(tk.content) || text[i:i+len(tk.content)] != tk.content {
				continue
			}
			s, e := i, i+len(tk.content)
			if tk.singleWord && !wordBoundary(text, s, e) {
				continue
			}
			if tk.lstrip {
				for s > from {
					r, size := utf8.DecodeLastRuneInString(text[from:s])
					if !unicode.IsSpace(r) {
						break
					}
					s -= size
				}
			}
			if tk.rstrip {
				for e < len(text) {
					r, size := utf8.DecodeRuneInString(text[e:])
					if !unicode.IsSpace(r) {
						break
					}
					e += size
				}
			}
			return s, e, tk.id
		}
	}
	return 0, 0, -1
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// wordBoundary reports whether text[s:e] is not glued to word characters.
func wordBoundary(text string, s, e int) bool {
	if s > 0 {
		r, _ := utf8.DecodeLastRuneInString(text[:s])
		if isWordRune(r) {
			return false
		}
	}
	if e < len(text) {
		r, _ := utf8.DecodeRuneInString(text[e:])
		if isWordRune(r) {
			return false
		}
	}
	return true
}

// chatTemplate is a parsed chat_template.
type chatTemplate struct {
	source string
	tmpl   *exec.Template
}
