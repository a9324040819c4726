package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// spOptions varies the SentencePiece-style fixture.
type spOptions struct {
	noByteFallback bool
	fuseUnk        bool
	// metaspace replaces the Prepend+Replace normalizer with a Metaspace
	// pre-tokenizer using this prepend_scheme.
	metaspace     string
	metaSplit     bool
	mergesAsPairs bool
}

// spTokens is the hand-written vocabulary after <unk>, <s>, </s> and the 256
// byte tokens (ids 259...).
var spTokens = []string{"▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "el", "ll", "lo", "▁he", "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world"}

// spMerges are ranked by position: "l l" beats "e l", which beats "▁h e".
var spMerges = [][2]string{
	{"▁", "h"}, {"l", "l"}, {"e", "l"}, {"▁h", "e"}, {"ll", "o"}, {"▁he", "llo"},
	{"o", "r"}, {"▁", "w"}, {"▁w", "or"}, {"l", "d"}, {"▁wor", "ld"}, {"l", "o"},
}

// spID returns the id of a hand-written token of the SentencePiece fixture.
func spID(tok string) int32 {
	for i, s := range spTokens {
		if s == tok {
			return int32(259 + i)
		}
	}
	panic("no token " + tok)
}

// spByte is the id of byte-fallback token <0xNN>.
func spByte(b byte) int32 { return 3 + int32(b) }

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mergesJSON(m [][2]string, pairs bool) any {
	if pairs {
		return m
	}
	out := make([]string, len(m))
	for i, p := range m {
		out[i] = p[0] + " " + p[1]
	}
	return out
}

// spJSON is a Llama 2 style tokenizer.json: byte fallback BPE over "▁"-spelled
// text.
func spJSON(t testing.TB, o spOptions) []byte {
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 3 + b
	}
	for i, s := range spTokens {
		vocab[s] = 259 + i
	}
	added := []map[string]any{}
	for i, s := range []string{"<unk>", "<s>", "</s>"} {
		added = append(added, map[string]any{"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	f := map[string]any{
		"version":      "1.0",
		"added_tokens": added,
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{
			"type":   "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":   []any{},
			"special_tokens": map[string]any{
				"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}},
			},
		},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"},
			map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": o.fuseUnk, "byte_fallback": !o.noByteFallback, "ignore_merges": false,
			"vocab": vocab, "merges": mergesJSON(spMerges, o.mergesAsPairs),
		},
	}
	if o.metaspace != "" {
		f["normalizer"] = nil
		f["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": o.metaspace, "split": o.metaSplit}
	}
	return mustJSON(t, f)
}

// spConfig is a Llama 2 style tokenizer_config.json.
const spConfig = `{"add_bos_token": true, "add_eos_token": false,
 "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
 "eos_token": "</s>", "unk_token": "<unk>",
 "chat_template": "{% for m in messages %}{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"}`

// Byte-level fixture: ids 0..255 are the bytes, then these merges; added
// tokens from 300.
var blMerges = [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "in"}, {"Ġin", "g"}}

// blExtra are vocabulary entries no merge builds (ignore_merges finds them).
var blExtra = []string{"Ġxyz"}

const (
	blBOS  = 300
	blEOT  = 301
	blIm   = 302
	blImX  = 303
	blMask = 304
)

// blJSON is a Llama 3 style byte-level tokenizer.json.
func blJSON(t testing.TB, ignoreMerges, mergesAsPairs bool) []byte {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevel.encode(string([]byte{byte(b)}))] = b
	}
	next := 256
	for _, m := range blMerges {
		vocab[m[0]+m[1]] = next
		next++
	}
	for _, s := range blExtra {
		vocab[s] = next
		next++
	}
	at := func(id int, content string, special, strip bool) map[string]any {
		return map[string]any{"id": id, "content": content, "single_word": false, "lstrip": strip, "rstrip": strip, "normalized": false, "special": special}
	}
	f := map[string]any{
		"added_tokens": []any{
			at(blBOS, "<|begin_of_text|>", true, false),
			at(blEOT, "<|eot_id|>", true, false),
			at(blIm, "<|im|>", false, false),
			at(blImX, "<|im|>x", false, false),
			at(blMask, "<mask>", false, true),
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
			map[string]any{
				"type":   "TemplateProcessing",
				"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
				"special_tokens": map[string]any{
					"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []int{blBOS}, "tokens": []string{"<|begin_of_text|>"}},
				},
			},
		}},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "unk_token": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignoreMerges,
			"vocab": vocab, "merges": mergesJSON(blMerges, mergesAsPairs),
		},
	}
	return mustJSON(t, f)
}

// blMergeID is the id of the token made by blMerges[i].
func blMergeID(i int) int32 { return int32(256 + i) }

func newSP(t testing.TB, o spOptions, cfg string) *Tokenizer {
	t.Helper()
	var c []byte
	if cfg != "" {
		c = []byte(cfg)
	}
	tk, err := New(spJSON(t, o), c)
	if err != nil {
		t.Fatalf("New(sentencepiece fixture): %v", err)
	}
	return tk
}

func newBL(t testing.TB, ignoreMerges bool) *Tokenizer {
	t.Helper()
	tk, err := New(blJSON(t, ignoreMerges, false), nil)
	if err != nil {
		t.Fatalf("New(byte-level fixture): %v", err)
	}
	return tk
}

func newSynth(t testing.TB, vocab int) *Tokenizer {
	t.Helper()
	tj, cj, err := Synthesize(vocab, 7)
	if err != nil {
		t.Fatalf("Synthesize(%d): %v", vocab, err)
	}
	tk, err := New(tj, cj)
	if err != nil {
		t.Fatalf("New(Synthesize(%d)): %v", vocab, err)
	}
	return tk
}

// randomText draws text from a mix of scripts, emoji (with ZWJ sequences and
// modifiers), combining marks, NUL, whitespace runs and newlines. It never
// produces "<" (added tokens) or "▁" (SentencePiece's space).
func randomText(rng *rand.Rand, maxRunes int) string {
	pools := []string{
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
		"0123456789",
		" ", "  ", "\t", "\n", "\r\n", "\n\n   ",
		".,;:!?'\"()[]{}#$%&*+-/=>@\\^_`|~",
		"éèêëàâäôöüçñßøåÉ",
		"\u0301\u0308\u0327", // combining marks
		"中文字符日本語テキスト한국어",
		"😀🙂🚀👍🏽👩‍💻🇫🇷❤️",
		"\u0000\u0001\u007f\u00a0\u200b\u2028\ufeff\ufffd",
		"Ελληνικάкириллицаעבריתالعربية",
	}
	n := rng.IntN(maxRunes + 1)
	var sb strings.Builder
	for i := 0; i < n; i++ {
		p := []rune(pools[rng.IntN(len(pools))])
		if rng.IntN(4) == 0 {
			sb.WriteString(" ")
		}
		sb.WriteRune(p[rng.IntN(len(p))])
	}
	return sb.String()
}
