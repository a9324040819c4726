package tokenizer

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	json "github.com/goccy/go-json"
	"golang.org/x/text/unicode/norm"
)

// jsonFile is the part of tokenizer.json this package reads.
type jsonFile struct {
	AddedTokens   []jsonAddedToken `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

type jsonAddedToken struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// jsonComponent holds the fields of every normalizer, pre-tokenizer,
// post-processor and decoder this package understands; Type says which.
type jsonComponent struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	Processors    []json.RawMessage `json:"processors"`

	Pattern          json.RawMessage `json:"pattern"`
	Content          *string         `json:"content"`
	Prepend          *string         `json:"prepend"`
	Behavior         string          `json:"behavior"`
	Invert           bool            `json:"invert"`
	AddPrefixSpace   *bool           `json:"add_prefix_space"`
	UseRegex         *bool           `json:"use_regex"`
	Replacement      *string         `json:"replacement"`
	PrependScheme    *string         `json:"prepend_scheme"`
	Split            *bool           `json:"split"`
	Start            int             `json:"start"`
	Stop             int             `json:"stop"`
	IndividualDigits bool            `json:"individual_digits"`
	StripLeft        *bool           `json:"strip_left"`
	StripRight       *bool           `json:"strip_right"`

	Single        json.RawMessage             `json:"single"`
	SpecialTokens map[string]jsonSpecialToken `json:"special_tokens"`
	Cls           []json.RawMessage           `json:"cls"`
	Sep           []json.RawMessage           `json:"sep"`
}

type jsonSpecialToken struct {
	ID  string  `json:"id"`
	IDs []int64 `json:"ids"`
}

type jsonPattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type jsonModel struct {
	Type                    string          `json:"type"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
	UnkToken                *string         `json:"unk_token"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
}

// jsonConfig is the part of tokenizer_config.json this package reads.
type jsonConfig struct {
	AddBOS       *bool           `json:"add_bos_token"`
	AddEOS       *bool           `json:"add_eos_token"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// fieldErr names the tokenizer.json field a problem was found in.
func fieldErr(field string, format string, args ...any) error {
	return fmt.Errorf("tokenizer.json: %s: %s", field, fmt.Sprintf(format, args...))
}

// build assembles a Tokenizer; extraTemplate is a chat template read from
// chat_template.jinja, used when the config has none.
func build(tj, cfgJSON []byte, extraTemplate string) (*Tokenizer, error) {
	// As Hugging Face's tokenizers (serde_json) do; the JSON decoder
	// would keep invalid bytes inside strings as they are.
	if !utf8.Valid(tj) {
		return nil, errors.New("tokenizer.json: parse: not valid UTF-8")
	}
	if !utf8.Valid(cfgJSON) {
		return nil, errors.New("tokenizer_config.json: parse: not valid UTF-8")
	}
	// The fast decoder skips keys it does not need without checking their
	// escapes, so a corrupted key ("byte_f\llback") would silently drop a
	// setting. The strict check runs beside the parse and joins it at the
	// end, so it costs no wall time where a second core is free.
	valid := make(chan bool, 1)
	go func() { valid <- stdjson.Valid(tj) }()
	if len(bytes.TrimSpace(cfgJSON)) > 0 && !stdjson.Valid(cfgJSON) {
		return nil, fmt.Errorf("tokenizer_config.json: parse: %w", strictErr(cfgJSON))
	}
	var f jsonFile
	if err := json.Unmarshal(tj, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: parse: %w", err)
	}
	if isNull(f.Model) {
		return nil, fieldErr("model", "missing")
	}
	var cfg jsonConfig
	if len(bytes.TrimSpace(cfgJSON)) > 0 {
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: parse: %w", err)
		}
	}

	t := &Tokenizer{tokenIDs: map[string]int32{}}
	byteLevelInput := false

	var err error
	if !isNull(f.Normalizer) {
		var bl bool
		t.normalizer, bl, err = parseNormalizer(f.Normalizer, "normalizer")
		if err != nil {
			return nil, err
		}
		byteLevelInput = byteLevelInput || bl
	}
	if !isNull(f.PreTokenizer) {
		var bl bool
		t.pre, bl, err = parsePreTokenizer(f.PreTokenizer, "pre_tokenizer")
		if err != nil {
			return nil, err
		}
		byteLevelInput = byteLevelInput || bl
	}
	if t.model, err = parseModel(f.Model, byteLevelInput); err != nil {
		return nil, err
	}

	// Ids: the model vocabulary, then added tokens on top.
	maxID := int64(-1)
	for _, id := range t.model.vocab {
		maxID = max(maxID, int64(id))
	}
	added := make([]addedToken, 0, len(f.AddedTokens))
	for i, a := range f.AddedTokens {
		field := fmt.Sprintf("added_tokens[%d]", i)
		if a.ID < 0 || a.ID >= maxTokenID {
			return nil, fieldErr(field+".id", "%d out of range", a.ID)
		}
		if a.Content == "" {
			return nil, fieldErr(field+".content", "empty")
		}
		maxID = max(maxID, a.ID)
		added = append(added, addedToken{
			content: a.Content, id: int32(a.ID), special: a.Special,
			lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord,
		})
	}
	n := int(maxID + 1)
	if tokens := len(t.model.vocab) + len(added); n > 2*tokens+4096 {
		return nil, fieldErr("model.vocab", "ids up to %d for only %d tokens", maxID, tokens)
	}
	t.idToToken = make([]string, n)
	t.hasToken = make([]bool, n)
	t.special = make([]bool, n)
	for tok, id := range t.model.vocab {
		t.idToToken[id] = tok
		t.hasToken[id] = true
	}
	for _, a := range added {
		t.idToToken[a.id] = a.content
		t.hasToken[a.id] = true
		t.special[a.id] = a.special
		t.tokenIDs[a.content] = a.id
	}
	t.added = newAddedMatcher(added)

	if !isNull(f.Decoder) {
		if err := parseDecoder(f.Decoder, "decoder", &t.dec, false); err != nil {
			return nil, err
		}
	} else {
		t.dec.joinSpace = true
	}
	if !isNull(f.PostProcessor) {
		if t.prefix, t.suffix, err = t.parsePostProcessor(f.PostProcessor, "post_processor"); err != nil {
			return nil, err
		}
	}
	if err := t.applyConfig(&cfg, extraTemplate); err != nil {
		return nil, err
	}
	if !<-valid {
		return nil, fmt.Errorf("tokenizer.json: parse: %w", strictErr(tj))
	}
	return t, nil
}

// strictErr is the standard decoder's error for data that is not JSON.
func strictErr(data []byte) error {
	var v any
	if err := stdjson.Unmarshal(data, &v); err != nil {
		return err
	}
	return errors.New("not valid JSON")
}

func parseComponent(raw json.RawMessage, field string) (*jsonComponent, error) {
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fieldErr(field, "parse: %v", err)
	}
	if c.Type == "" {
		return nil, fieldErr(field+".type", "missing")
	}
	return &c, nil
}

// compileRegex compiles a tokenizers (Oniguruma-flavoured) pattern, with
// RegexMatchTimeout set. All regexp2 patterns of the package go through it.
func compileRegex(pat, field string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(pat, regexp2.OptionMaxBacktrackingStackSize(-1))
	if err != nil {
		return nil, fieldErr(field, "compile regex %q: %v", pat, err)
	}
	// Every pattern comes from a pushed tokenizer.json: bound each match so
	// a catastrophically backtracking one fails the request, not the engine.
	re.MatchTimeout = RegexMatchTimeout
	return re, nil
}

// parsePattern reads {"String": s} or {"Regex": r}.
func parsePattern(raw json.RawMessage, field string) (literal string, re *regexp2.Regexp, err error) {
	if isNull(raw) {
		return "", nil, fieldErr(field, "missing")
	}
	var p jsonPattern
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", nil, fieldErr(field, "parse: %v", err)
	}
	switch {
	case p.Regex != nil:
		re, err := compileRegex(*p.Regex, field+".Regex")
		return "", re, err
	case p.String != nil:
		if *p.String == "" {
			return "", nil, fieldErr(field+".String", "empty")
		}
		return *p.String, nil, nil
	}
	return "", nil, fieldErr(field, "want {\"String\": ...} or {\"Regex\": ...}")
}

func parseNormalizer(raw json.RawMessage, field string) (normalizer, bool, error) {
	c, err := parseComponent(raw, field)
	if err != nil {
		return nil, false, err
	}
	switch c.Type {
	case "Sequence":
		var seq normSequence
		bl := false
		for i, sub := range c.Normalizers {
			if isNull(sub) {
				continue
			}
			n, b, err := parseNormalizer(sub, fmt.Sprintf("%s.normalizers[%d]", field, i))
			if err != nil {
				return nil, false, err
			}
			bl = bl || b
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, bl, nil
	case "Prepend":
		if c.Prepend == nil {
			return nil, false, fieldErr(field+".prepend", "missing")
		}
		return normPrepend{*c.Prepend}, false, nil
	case "Replace":
		lit, re, err := parsePattern(c.Pattern, field+".pattern")
		if err != nil {
			return nil, false, err
		}
		if c.Content == nil {
			return nil, false, fieldErr(field+".content", "missing")
		}
		return normReplace{literal: lit, re: re, content: *c.Content}, false, nil
	case "Lowercase":
		return normLowercase{}, false, nil
	case "NFC":
		return normUnicode{norm.NFC}, false, nil
	case "NFD":
		return normUnicode{norm.NFD}, false, nil
	case "NFKC":
		return normUnicode{norm.NFKC}, false, nil
	case "NFKD":
		return normUnicode{norm.NFKD}, false, nil
	case "Strip":
		return normStrip{left: c.StripLeft == nil || *c.StripLeft, right: c.StripRight == nil || *c.StripRight}, false, nil
	case "ByteLevel":
		return nil, true, nil
	}
	return nil, false, fieldErr(field+".type", "unsupported normalizer %q", c.Type)
}

// gpt2Pattern is the split ByteLevel applies when use_regex is set.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func parsePreTokenizer(raw json.RawMessage, field string) (preTokenizer, bool, error) {
	c, err := parseComponent(raw, field)
	if err != nil {
		return nil, false, err
	}
	switch c.Type {
	case "Sequence":
		var seq preSequence
		bl := false
		for i, sub := range c.Pretokenizers {
			if isNull(sub) {
				continue
			}
			p, b, err := parsePreTokenizer(sub, fmt.Sprintf("%s.pretokenizers[%d]", field, i))
			if err != nil {
				return nil, false, err
			}
			bl = bl || b
			seq = append(seq, p)
		}
		if len(seq) == 1 {
			return seq[0], bl, nil
		}
		return seq, bl, nil
	case "Split":
		lit, re, err := parsePattern(c.Pattern, field+".pattern")
		if err != nil {
			return nil, false, err
		}
		b, ok := parseBehavior(c.Behavior)
		if !ok {
			return nil, false, fieldErr(field+".behavior", "unsupported %q", c.Behavior)
		}
		return &preSplit{literal: lit, re: re, behavior: b, invert: c.Invert}, false, nil
	case "ByteLevel":
		p := preByteLevel{addPrefixSpace: c.AddPrefixSpace != nil && *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			re, err := compileRegex(gpt2Pattern, field+".use_regex")
			if err != nil {
				return nil, false, err
			}
			p.regex = &preSplit{re: re, behavior: behaviorIsolated}
		}
		return p, true, nil
	case "Metaspace":
		p := preMetaspace{replacement: "▁", splitAll: c.Split == nil || *c.Split}
		if c.Replacement != nil {
			if *c.Replacement == "" {
				return nil, false, fieldErr(field+".replacement", "empty")
			}
			p.replacement = *c.Replacement
		}
		switch {
		case c.PrependScheme != nil:
			switch *c.PrependScheme {
			case "always":
				p.scheme = prependAlways
			case "first":
				p.scheme = prependFirst
			case "never":
				p.scheme = prependNever
			default:
				return nil, false, fieldErr(field+".prepend_scheme", "unsupported %q", *c.PrependScheme)
			}
		case c.AddPrefixSpace != nil && !*c.AddPrefixSpace:
			p.scheme = prependNever
		}
		return p, false, nil
	case "Whitespace":
		re, err := compileRegex(`\w+|[^\w\s]+`, field)
		if err != nil {
			return nil, false, err
		}
		return &preSplit{re: re, behavior: behaviorRemoved, invert: true}, false, nil
	case "WhitespaceSplit":
		return preFunc{f: isSpace, behavior: behaviorRemoved}, false, nil
	case "Digits":
		b := behaviorContiguous
		if c.IndividualDigits {
			b = behaviorIsolated
		}
		return preFunc{f: isNumber, behavior: b}, false, nil
	case "Punctuation":
		b := behaviorIsolated
		if c.Behavior != "" {
			var ok bool
			if b, ok = parseBehavior(c.Behavior); !ok {
				return nil, false, fieldErr(field+".behavior", "unsupported %q", c.Behavior)
			}
		}
		return preFunc{f: isPunct, behavior: b}, false, nil
	}
	return nil, false, fieldErr(field+".type", "unsupported pre-tokenizer %q", c.Type)
}

// parseDecoder compiles a decoder (chain) into plan. fused says a Fuse came
// earlier, which turns a Strip into a strip of the whole text.
func parseDecoder(raw json.RawMessage, field string, plan *decoderPlan, fused bool) error {
	c, err := parseComponent(raw, field)
	if err != nil {
		return err
	}
	switch c.Type {
	case "Sequence":
		for i, sub := range c.Decoders {
			if isNull(sub) {
				continue
			}
			subField := fmt.Sprintf("%s.decoders[%d]", field, i)
			sc, err := parseComponent(sub, subField)
			if err != nil {
				return err
			}
			if sc.Type == "Fuse" {
				fused = true
				continue
			}
			if err := parseDecoder(sub, subField, plan, fused); err != nil {
				return err
			}
		}
		return nil
	case "Fuse":
		return nil
	case "ByteLevel":
		plan.steps = append(plan.steps, decStep{kind: decByteLevel})
		return nil
	case "ByteFallback":
		plan.steps = append(plan.steps, decStep{kind: decByteFallback})
		return nil
	case "Replace":
		lit, re, err := parsePattern(c.Pattern, field+".pattern")
		if err != nil {
			return err
		}
		if re != nil {
			return fieldErr(field+".pattern.Regex", "regex patterns are not supported in decoders")
		}
		if c.Content == nil {
			return fieldErr(field+".content", "missing")
		}
		plan.steps = append(plan.steps, decStep{kind: decReplace, from: lit, to: *c.Content})
		return nil
	case "Strip":
		if c.Content == nil || *c.Content == "" {
			return fieldErr(field+".content", "missing")
		}
		if c.Start < 0 || c.Stop < 0 {
			return fieldErr(field, "negative start/stop")
		}
		if fused {
			plan.lead, plan.leadCount = *c.Content, c.Start
			plan.trail, plan.trailCount = *c.Content, c.Stop
			return nil
		}
		plan.steps = append(plan.steps, decStep{kind: decStrip, content: *c.Content, start: c.Start, stop: c.Stop})
		return nil
	case "Metaspace":
		st := decStep{kind: decMetaspace, from: "▁", stripFirst: true}
		if c.Replacement != nil && *c.Replacement != "" {
			st.from = *c.Replacement
		}
		if (c.PrependScheme != nil && *c.PrependScheme == "never") ||
			(c.PrependScheme == nil && c.AddPrefixSpace != nil && !*c.AddPrefixSpace) {
			st.stripFirst = false
		}
		plan.steps = append(plan.steps, st)
		return nil
	}
	return fieldErr(field+".type", "unsupported decoder %q", c.Type)
}

func parseModel(raw json.RawMessage, byteLevelInput bool) (*bpeModel, error) {
	var jm jsonModel
	if err := json.Unmarshal(raw, &jm); err != nil {
		return nil, fieldErr("model", "parse: %v", err)
	}
	if jm.Type == "" && !isNull(jm.Merges) {
		jm.Type = "BPE"
	}
	if jm.Type != "BPE" {
		return nil, fieldErr("model.type", "unsupported model %q (only BPE)", jm.Type)
	}
	if jm.ContinuingSubwordPrefix != nil && *jm.ContinuingSubwordPrefix != "" {
		return nil, fieldErr("model.continuing_subword_prefix", "not supported")
	}
	if jm.EndOfWordSuffix != nil && *jm.EndOfWordSuffix != "" {
		return nil, fieldErr("model.end_of_word_suffix", "not supported")
	}
	if isNull(jm.Vocab) {
		return nil, fieldErr("model.vocab", "missing")
	}
	m := &bpeModel{
		unk:          -1,
		fuseUnk:      jm.FuseUnk,
		byteFallback: jm.ByteFallback,
		ignoreMerges: jm.IgnoreMerges,
		byteLevel:    byteLevelInput,
		cache:        newWordCache(),
	}
	// The merges decode while the vocabulary does; resolving them needs it.
	var merges rawMerges
	var mergesErr error
	decoded := make(chan struct{})
	go func() {
		defer close(decoded)
		merges, mergesErr = decodeMerges(jm.Merges)
	}()
	defer func() { <-decoded }()
	if err := json.Unmarshal(jm.Vocab, &m.vocab); err != nil {
		return nil, fieldErr("model.vocab", "parse: %v", err)
	}
	seen := make([]bool, len(m.vocab))
	var seenSparse map[int32]bool // ids past the vocabulary's size
	for tok, id := range m.vocab {
		if id < 0 || id >= maxTokenID {
			return nil, fieldErr("model.vocab", "token %q has id %d out of range", tok, id)
		}
		var dup bool
		if int(id) < len(seen) {
			dup, seen[id] = seen[id], true
		} else {
			if seenSparse == nil {
				seenSparse = map[int32]bool{}
			}
			dup, seenSparse[id] = seenSparse[id], true
		}
		if dup {
			for other, oid := range m.vocab {
				if oid == id && other != tok {
					a, b := min(other, tok), max(other, tok)
					return nil, fieldErr("model.vocab", "tokens %q and %q share id %d", a, b, id)
				}
			}
		}
	}
	if jm.UnkToken != nil && *jm.UnkToken != "" {
		id, ok := m.vocab[*jm.UnkToken]
		if !ok {
			return nil, fieldErr("model.unk_token", "%q is not in model.vocab", *jm.UnkToken)
		}
		m.unk = id
	}
	for b := 0; b < 256; b++ {
		m.fallbackIDs[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackIDs[b] = id
		}
	}
	if m.byteLevel {
		for b := 0; b < 256; b++ {
			m.byteIDs[b] = -1
			if id, ok := m.vocab[string(byteLevel.toRune[b])]; ok {
				m.byteIDs[b] = id
			}
		}
	}
	<-decoded
	if mergesErr != nil {
		return nil, mergesErr
	}
	if err := m.resolveMerges(merges); err != nil {
		return nil, err
	}
	return m, nil
}

// rawMerges are model.merges as decoded: "a b" strings, or the [a, b]
// pairs newer tokenizers write. Their order is their rank.
type rawMerges struct {
	strs  []string
	pairs [][]string
}

func (r rawMerges) len() int { return len(r.strs) + len(r.pairs) }

// decodeMerges decodes model.merges, naming the item at fault when it is
// in neither form.
func decodeMerges(raw json.RawMessage) (rawMerges, error) {
	var r rawMerges
	if isNull(raw) {
		return r, nil
	}
	if err := json.Unmarshal(raw, &r.strs); err == nil {
		return r, nil
	}
	r.strs = nil
	if err := json.Unmarshal(raw, &r.pairs); err == nil {
		for i, p := range r.pairs {
			if len(p) != 2 {
				return r, fieldErr(mergeField(i).String(), "want \"a b\" or [\"a\", \"b\"], got %d strings", len(p))
			}
		}
		return r, nil
	}
	// Neither form throughout: name the first item unlike the first.
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return r, fieldErr("model.merges", "parse: %v", err)
	}
	var str string
	strForm := json.Unmarshal(items[0], &str) == nil
	for i, it := range items {
		var p []string
		if strForm && json.Unmarshal(it, &str) != nil {
			return r, fieldErr(mergeField(i).String(), "want an \"a b\" string like the merges before it, got %s", truncate(string(it), 60))
		}
		if !strForm && (json.Unmarshal(it, &p) != nil || len(p) != 2) {
			return r, fieldErr(mergeField(i).String(), "want \"a b\" or [\"a\", \"b\"], got %s", truncate(string(it), 60))
		}
	}
	return r, fieldErr("model.merges", "parse: not a list of merges")
}

// resolvedMerge is one merge by token ids: a and b make id.
type resolvedMerge struct{ a, b, id int32 }

// mergeChunk is the number of merges one goroutine resolves at least.
const mergeChunk = 1 << 14

// resolveMerges looks up every merge's tokens in the vocabulary, spread
// over the CPUs, and records them by rank; the first of duplicate merges
// wins.
func (m *bpeModel) resolveMerges(r rawMerges) error {
	n := r.len()
	resolved := make([]resolvedMerge, n)
	chunks := max(1, min(runtime.GOMAXPROCS(0), n/mergeChunk))
	errs := make([]error, chunks)
	var wg sync.WaitGroup
	for c := range chunks {
		wg.Go(func() { errs[c] = m.resolveRange(r, resolved, n*c/chunks, n*(c+1)/chunks) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err // the lowest-ranked merge at fault
		}
	}
	m.merges = make(map[uint64]merge, n)
	for i, rm := range resolved {
		k := pairKey(rm.a, rm.b)
		if _, dup := m.merges[k]; !dup {
			m.merges[k] = merge{rank: int32(i), id: rm.id}
		}
	}
	return nil
}

// resolveRange resolves merges [lo, hi) into resolved, stopping at the
// first that names a token outside the vocabulary.
func (m *bpeModel) resolveRange(r rawMerges, resolved []resolvedMerge, lo, hi int) error {
	var joined [64]byte
	for i := lo; i < hi; i++ {
		var a, b string
		if r.strs != nil {
			var ok bool
			if a, b, ok = m.splitMerge(r.strs[i]); !ok {
				return fieldErr(mergeField(i).String(), "%q is not two vocabulary tokens separated by a space", truncate(r.strs[i], 60))
			}
		} else {
			a, b = r.pairs[i][0], r.pairs[i][1]
		}
		ida, ok := m.vocab[a]
		if !ok {
			return fieldErr(mergeField(i).String(), "token %q is not in model.vocab", a)
		}
		idb, ok := m.vocab[b]
		if !ok {
			return fieldErr(mergeField(i).String(), "token %q is not in model.vocab", b)
		}
		id, ok := m.vocab[string(append(append(joined[:0], a...), b...))]
		if !ok {
			return fieldErr(mergeField(i).String(), "merged token %q is not in model.vocab", a+b)
		}
		resolved[i] = resolvedMerge{a: ida, b: idb, id: id}
	}
	return nil
}

// mergeField names merge i in errors; it is a string only when printed,
// since merges number in the hundreds of thousands.
type mergeField int

func (i mergeField) String() string { return fmt.Sprintf("model.merges[%d]", int(i)) }

// splitMerge splits "a b" at the space that leaves two vocabulary tokens
// (normally the only space).
func (m *bpeModel) splitMerge(s string) (string, string, bool) {
	first := strings.IndexByte(s, ' ')
	if first < 0 {
		return "", "", false
	}
	if strings.IndexByte(s[first+1:], ' ') < 0 {
		return s[:first], s[first+1:], true // the one split there is
	}
	for i := first; i >= 0 && i < len(s); {
		a, b := s[:i], s[i+1:]
		if _, ok := m.vocab[a]; ok {
			if _, ok := m.vocab[b]; ok {
				return a, b, true
			}
		}
		j := strings.IndexByte(s[i+1:], ' ')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	// Report the conventional split so the error names the missing token.
	return s[:first], s[first+1:], true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// parsePostProcessor returns the ids the post-processor puts before and
// after a single sequence.
func (t *Tokenizer) parsePostProcessor(raw json.RawMessage, field string) (prefix, suffix []int32, err error) {
	c, err := parseComponent(raw, field)
	if err != nil {
		return nil, nil, err
	}
	switch c.Type {
	case "Sequence":
		for i, sub := range c.Processors {
			if isNull(sub) {
				continue
			}
			p, s, err := t.parsePostProcessor(sub, fmt.Sprintf("%s.processors[%d]", field, i))
			if err != nil {
				return nil, nil, err
			}
			// Later processors wrap what earlier ones produced.
			prefix = append(p, prefix...)
			suffix = append(suffix, s...)
		}
		return prefix, suffix, nil
	case "ByteLevel":
		return nil, nil, nil
	case "TemplateProcessing":
		return t.parseTemplateSingle(c, field)
	case "BertProcessing", "RobertaProcessing":
		cls, err := t.tokenPair(c.Cls, field+".cls")
		if err != nil {
			return nil, nil, err
		}
		sep, err := t.tokenPair(c.Sep, field+".sep")
		if err != nil {
			return nil, nil, err
		}
		return []int32{cls}, []int32{sep}, nil
	}
	return nil, nil, fieldErr(field+".type", "unsupported post-processor %q", c.Type)
}

// tokenPair reads ["[CLS]", 101].
func (t *Tokenizer) tokenPair(p []json.RawMessage, field string) (int32, error) {
	if len(p) != 2 {
		return 0, fieldErr(field, "want [token, id]")
	}
	var id int64
	if err := json.Unmarshal(p[1], &id); err != nil || id < 0 || int(id) >= len(t.idToToken) {
		return 0, fieldErr(field, "bad id %s", truncate(string(p[1]), 30))
	}
	return int32(id), nil
}

func (t *Tokenizer) parseTemplateSingle(c *jsonComponent, field string) (prefix, suffix []int32, err error) {
	field += ".single"
	type ref struct {
		special bool
		name    string
	}
	var refs []ref
	if isNull(c.Single) {
		return nil, nil, nil
	}
	var asString string
	if json.Unmarshal(c.Single, &asString) == nil {
		for _, w := range strings.Fields(asString) {
			if strings.HasPrefix(w, "$") {
				refs = append(refs, ref{false, w})
				continue
			}
			name, _, _ := strings.Cut(w, ":")
			refs = append(refs, ref{true, name})
		}
	} else {
		var items []map[string]struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(c.Single, &items); err != nil {
			return nil, nil, fieldErr(field, "parse: %v", err)
		}
		for i, it := range items {
			if st, ok := it["SpecialToken"]; ok {
				refs = append(refs, ref{true, st.ID})
			} else if sq, ok := it["Sequence"]; ok {
				refs = append(refs, ref{false, sq.ID})
			} else {
				return nil, nil, fieldErr(fmt.Sprintf("%s[%d]", field, i), "want SpecialToken or Sequence")
			}
		}
	}
	seenSeq := false
	for i, r := range refs {
		if !r.special {
			seenSeq = true
			continue
		}
		var ids []int32
		if st, ok := c.SpecialTokens[r.name]; ok && len(st.IDs) > 0 {
			for _, id := range st.IDs {
				if id < 0 || int(id) >= len(t.idToToken) {
					return nil, nil, fieldErr(fmt.Sprintf("%s.special_tokens[%q].ids", strings.TrimSuffix(field, ".single"), r.name), "id %d out of range", id)
				}
				ids = append(ids, int32(id))
			}
		} else if id, ok := t.TokenID(r.name); ok {
			ids = []int32{id}
		} else {
			return nil, nil, fieldErr(fmt.Sprintf("%s[%d]", field, i), "special token %q is unknown", r.name)
		}
		if seenSeq {
			suffix = append(suffix, ids...)
		} else {
			prefix = append(prefix, ids...)
		}
	}
	return prefix, suffix, nil
}

// configToken reads a token named in tokenizer_config.json: a string or an
// object with "content".
func configToken(raw json.RawMessage, field string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("tokenizer_config.json: %s: want a string or {\"content\": ...}", field)
	}
	return obj.Content, nil
}

// endOfTextTokens end a document; EOS includes those the tokenizer has as
// special tokens.
var endOfTextTokens = []string{"<|end_of_text|>", "<|endoftext|>", "</s>"}

// endOfTurnTokens end a chat turn; EOS includes those the chat template or
// eos_token names.
var endOfTurnTokens = []string{"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"}

// applyConfig reads tokenizer_config.json's special tokens, add_bos/eos and
// chat template.
func (t *Tokenizer) applyConfig(cfg *jsonConfig, extraTemplate string) error {
	var err error
	if t.bosToken, err = configToken(cfg.BOSToken, "bos_token"); err != nil {
		return err
	}
	if t.eosToken, err = configToken(cfg.EOSToken, "eos_token"); err != nil {
		return err
	}
	if id, ok := t.TokenID(t.bosToken); ok && t.bosToken != "" {
		t.bos, t.hasBOS = id, true
	} else if len(t.prefix) > 0 {
		t.bos, t.hasBOS = t.prefix[0], true
		t.bosToken = t.idToToken[t.prefix[0]]
	}
	eosID, hasEOS := int32(0), false
	if t.eosToken != "" {
		eosID, hasEOS = t.TokenID(t.eosToken)
	}
	if cfg.AddBOS != nil {
		t.prefix = removeID(t.prefix, t.bos, t.hasBOS)
		if *cfg.AddBOS && t.hasBOS {
			t.prefix = append([]int32{t.bos}, t.prefix...)
		}
	}
	if cfg.AddEOS != nil {
		t.suffix = removeID(t.suffix, eosID, hasEOS)
		if *cfg.AddEOS && hasEOS {
			t.suffix = append(t.suffix, eosID)
		}
	}

	src, err := chatTemplateSource(cfg.ChatTemplate)
	if err != nil {
		return err
	}
	if src == "" {
		src = extraTemplate
	}
	if src != "" {
		if t.chat, err = parseChatTemplate(src); err != nil {
			return fmt.Errorf("%s chat_template does not compile: %w", ConfigFile, err)
		}
	}

	seen := map[int32]bool{}
	addEOS := func(id int32) {
		if !seen[id] {
			seen[id] = true
			t.eos = append(t.eos, id)
		}
	}
	if hasEOS {
		addEOS(eosID)
	}
	hasConfig := hasEOS || src != ""
	for _, name := range endOfTextTokens {
		if id, ok := t.tokenIDs[name]; ok && t.special[id] {
			addEOS(id)
		}
	}
	for _, name := range endOfTurnTokens {
		if id, ok := t.tokenIDs[name]; ok && t.special[id] && (!hasConfig || strings.Contains(src, name)) {
			addEOS(id)
		}
	}
	return nil
}

func removeID(ids []int32, id int32, ok bool) []int32 {
	if !ok {
		return ids
	}
	out := ids[:0:0]
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

// chatTemplateSource reads chat_template: a string, or a list of
// {"name", "template"} of which "default" (else the first) is used.
func chatTemplateSource(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("tokenizer_config.json: chat_template: want a string or a list of {name, template}")
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
	}
	if len(list) > 0 {
		return list[0].Template, nil
	}
	return "", nil
}
