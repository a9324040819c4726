package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stokehq/stoke/internal/testmodel"
)

func TestEncodeSentencePiece(t *testing.T) {
	h, he, hel := spID("▁h"), spID("▁he"), spID("el")
	ll, llo, lo := spID("ll"), spID("llo"), spID("lo")
	hello, world, sp := spID("▁hello"), spID("▁world"), spID("▁")
	tests := []struct {
		name    string
		opts    spOptions
		text    string
		special bool
		want    []int32
	}{
		{"words", spOptions{}, "hello world", false, []int32{hello, world}},
		{"merge pairs format", spOptions{mergesAsPairs: true}, "hello world", false, []int32{hello, world}},
		{"with bos", spOptions{}, "hello world", true, []int32{1, hello, world}},
		{"l l outranks e l", spOptions{}, "hell", false, []int32{he, ll}},
		{"e l outranks ▁h e", spOptions{}, "hel", false, []int32{h, hel}},
		{"l l outranks l o", spOptions{}, "llo", false, []int32{sp, llo}},
		{"l o alone", spOptions{}, "lo", false, []int32{sp, lo}},
		{"leading space", spOptions{}, " hello", false, []int32{sp, hello}},
		{"empty", spOptions{}, "", false, []int32{}},
		{"empty with bos", spOptions{}, "", true, []int32{1}},
		{"byte fallback", spOptions{}, "hé", false, []int32{h, spByte(0xC3), spByte(0xA9)}},
		{"byte fallback emoji", spOptions{}, "🙂", false, []int32{sp, spByte(0xF0), spByte(0x9F), spByte(0x99), spByte(0x82)}},
		{"unk", spOptions{noByteFallback: true}, "héé", false, []int32{h, 0, 0}},
		{"fused unk", spOptions{noByteFallback: true, fuseUnk: true}, "héé", false, []int32{h, 0}},
		{"added token in text", spOptions{}, "hello<s>hello", false, []int32{hello, 1, hello}},
		{"added token first", spOptions{}, "</s>hello", false, []int32{2, hello}},
		{"metaspace always", spOptions{metaspace: "always"}, "hello world", false, []int32{hello, world}},
		{"metaspace split", spOptions{metaspace: "always", metaSplit: true}, "hello world", false, []int32{hello, world}},
		{"metaspace first after added", spOptions{metaspace: "first"}, "<s>hello", false, []int32{1, spID("h"), spID("e"), llo}},
		{"metaspace first at start", spOptions{metaspace: "first"}, "hello<s>hello", false, []int32{hello, 1, spID("h"), spID("e"), llo}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk := newSP(t, tc.opts, "")
			got := tk.Encode(tc.text, tc.special)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

func TestEncodeByteLevel(t *testing.T) {
	the, he := blMergeID(2), blMergeID(1)
	in, ing := blMergeID(4), blMergeID(5)
	xyz := blMergeID(len(blMerges))
	b := func(s string) []int32 {
		out := make([]int32, len(s))
		for i := 0; i < len(s); i++ {
			out[i] = int32(s[i])
		}
		return out
	}
	cat := func(parts ...[]int32) []int32 { return slices.Concat(parts...) }
	tests := []struct {
		name         string
		ignoreMerges bool
		text         string
		special      bool
		want         []int32
	}{
		{"merge order", false, "the theme", false, cat(b("t"), []int32{he, the}, b("me"))},
		{"bos", false, "the", true, cat([]int32{blBOS}, b("t"), []int32{he})},
		{"i n before Ġ in", false, " in", false, []int32{in}},
		{"three merges", false, " ing", false, []int32{ing}},
		{"ignore merges on", true, " xyz", false, []int32{xyz}},
		{"ignore merges off", false, " xyz", false, b(" xyz")},
		{"contraction split", false, "it's", false, b("it's")},
		{"digits in threes", false, "12345", false, b("12345")},
		{"newlines", false, "a\n\nb", false, b("a\n\nb")},
		{"utf8 bytes", false, "é🙂", false, b("é🙂")},
		{"special tokens", false, "<|begin_of_text|>the<|eot_id|>", false, cat([]int32{blBOS}, b("t"), []int32{he, blEOT})},
		{"longest added token wins", false, "<|im|>x<|im|>", false, []int32{blImX, blIm}},
		{"lstrip rstrip", false, "a <mask> b", false, cat(b("a"), []int32{blMask}, b("b"))},
		{"almost special", false, "<|eot_id", false, b("<|eot_id")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk := newBL(t, tc.ignoreMerges)
			got := tk.Encode(tc.text, tc.special)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
	t.Run("pairs format equals strings format", func(t *testing.T) {
		a := newBL(t, true)
		bt, err := New(blJSON(t, true, true), nil)
		if err != nil {
			t.Fatal(err)
		}
		s := "the theme in ing xyz thing"
		if x, y := a.Encode(s, true), bt.Encode(s, true); !slices.Equal(x, y) {
			t.Errorf("string merges %v != pair merges %v", x, y)
		}
	})
}

// TestEncodeLongWord drives the heap merge path (one pre-token longer than
// smallWord symbols) and checks it against the quadratic path.
func TestEncodeLongWord(t *testing.T) {
	tk := newSP(t, spOptions{}, "")
	text := strings.Repeat("hellohelloworldhellll", 20) // one SentencePiece pre-token
	got := tk.Encode(text, false)
	syms := tk.model.symbols("▁"+text, nil)
	want := tk.model.mergeSmall(syms)
	if !slices.Equal(got, want) {
		t.Fatalf("heap merge %v\n!= quadratic merge %v", got, want)
	}
	if len(got) >= len(syms) {
		t.Fatalf("no merges applied: %d tokens for %d symbols", len(got), len(syms))
	}
	// Cached and uncached encodes agree.
	if again := tk.Encode(text, false); !slices.Equal(again, got) {
		t.Fatalf("second encode %v != first %v", again, got)
	}
}

func TestDecode(t *testing.T) {
	sp := newSP(t, spOptions{}, "")
	bl := newBL(t, false)
	hello, world := spID("▁hello"), spID("▁world")
	tests := []struct {
		name        string
		tk          *Tokenizer
		ids         []int32
		skipSpecial bool
		want        string
	}{
		{"sp words", sp, []int32{hello, world}, false, "hello world"},
		{"sp keeps specials", sp, []int32{1, hello, world, 2}, false, "<s> hello world</s>"},
		{"sp skips specials", sp, []int32{1, hello, world, 2}, true, "hello world"},
		{"sp byte fallback", sp, []int32{spID("▁h"), spByte(0xC3), spByte(0xA9)}, false, "hé"},
		{"sp only one space stripped", sp, []int32{spID("▁"), spID("▁")}, false, " "},
		{"sp incomplete char", sp, []int32{spByte(0xE2), spByte(0x82)}, false, "\uFFFD"},
		{"sp invalid then ascii", sp, []int32{spByte(0xE2), spByte(0x82), spID("h")}, false, "\uFFFDh"},
		{"sp unknown id ignored", sp, []int32{hello, 99999, -1, world}, false, "hello world"},
		{"bl text", bl, []int32{'t', blMergeID(1), blMergeID(2)}, false, "the the"},
		{"bl special kept", bl, []int32{blBOS, 'h', 'i', blEOT}, false, "<|begin_of_text|>hi<|eot_id|>"},
		{"bl special skipped", bl, []int32{blBOS, 'h', 'i', blEOT}, true, "hi"},
		{"bl non-special added kept", bl, []int32{blIm, 'a'}, true, "<|im|>a"},
		{"bl lone continuation byte", bl, []int32{0x80, 'a'}, false, "\uFFFDa"},
		{"bl truncated emoji", bl, []int32{0xF0, 0x9F, 0x99}, false, "\uFFFD"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.tk.Decode(tc.ids, tc.skipSpecial); got != tc.want {
				t.Errorf("Decode(%v) = %q, want %q", tc.ids, got, tc.want)
			}
		})
	}
}

func TestDecoderVariants(t *testing.T) {
	vocab := map[string]int{"▁hello": 0, "▁world": 1, "x": 2, "▁": 3}
	model := map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}}
	tests := []struct {
		name    string
		decoder any
		ids     []int32
		want    string
	}{
		{"metaspace", map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}, []int32{0, 1}, "hello world"},
		{"metaspace never", map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"}, []int32{0, 1}, " hello world"},
		{"no decoder joins with spaces", nil, []int32{2, 2}, "x x"},
		{"strip per token", map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}}, []int32{0, 1}, "helloworld"},
		{"strip after fuse both ends", map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 1},
		}}, []int32{0, 3, 1, 3, 3}, "hello  world "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk, err := New(mustJSON(t, map[string]any{"model": model, "decoder": tc.decoder}), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := tk.Decode(tc.ids, false); got != tc.want {
				t.Errorf("Decode(%v) = %q, want %q", tc.ids, got, tc.want)
			}
			var sb strings.Builder
			d := tk.NewStreamDecoder(false)
			for _, id := range tc.ids {
				sb.WriteString(d.Add(id))
			}
			sb.WriteString(d.Flush())
			if sb.String() != tc.want {
				t.Errorf("stream decode %q, want %q", sb.String(), tc.want)
			}
		})
	}
}

// TestRoundTrip checks Decode(Encode(s)) == s on random Unicode text for both
// kinds of tokenizer, and that the stream decoder agrees with Decode and
// never returns broken UTF-8.
func TestRoundTrip(t *testing.T) {
	kinds := []struct {
		name string
		tk   *Tokenizer
		// dropsLeadingSpace: Metaspace does not add "▁" before text that
		// already starts with a space, so decoding loses that space (as in
		// the tokenizers library).
		dropsLeadingSpace bool
	}{
		{"sentencepiece", newSP(t, spOptions{}, ""), false},
		{"sentencepiece metaspace", newSP(t, spOptions{metaspace: "first"}, ""), true},
		{"byte-level fixture", newBL(t, true), false},
		{"synthesized", newSynth(t, 2000), false},
	}
	fixed := []string{"", " ", "  ", "\n", "\u0000", "a\u0000b", "\r\n\r\n", "e\u0301", "👩‍💻 and 🇫🇷", "中文 日本語", "  leading and trailing  ", "tab\tsep", "\ufffd"}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			cases := append([]string(nil), fixed...)
			for range 300 {
				cases = append(cases, randomText(rng, 40))
			}
			for _, s := range cases {
				want := s
				if k.dropsLeadingSpace {
					want = strings.TrimPrefix(s, " ")
				}
				ids := k.tk.Encode(s, false)
				got := k.tk.Decode(ids, false)
				if got != want {
					t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
				}
				withBOS := k.tk.Encode(s, true)
				if got := k.tk.Decode(withBOS, true); got != want {
					t.Fatalf("Decode(Encode(%q, bos), skip) = %q", s, got)
				}
				d := k.tk.NewStreamDecoder(false)
				var sb strings.Builder
				for _, id := range ids {
					piece := d.Add(id)
					if !utf8.ValidString(piece) {
						t.Fatalf("Add returned invalid UTF-8 %q while decoding %q", piece, s)
					}
					sb.WriteString(piece)
				}
				rest := d.Flush()
				if !utf8.ValidString(rest) {
					t.Fatalf("Flush returned invalid UTF-8 %q", rest)
				}
				sb.WriteString(rest)
				if sb.String() != got {
					t.Fatalf("stream decode %q != Decode %q", sb.String(), got)
				}
			}
		})
	}
}

func TestStreamDecoderHoldsPartialCharacters(t *testing.T) {
	bl := newBL(t, false)
	d := bl.NewStreamDecoder(false)
	emoji := "🙂" // four bytes, four byte tokens
	for i := 0; i < 3; i++ {
		if got := d.Add(int32(emoji[i])); got != "" {
			t.Fatalf("Add(byte %d of emoji) = %q, want nothing yet", i, got)
		}
	}
	if got := d.Add(int32(emoji[3])); got != emoji {
		t.Fatalf("Add(last byte) = %q, want %q", got, emoji)
	}
	if got := d.Add(0xE4); got != "" { // first byte of 中
		t.Fatalf("Add(lead byte) = %q", got)
	}
	if got := d.Flush(); got != "\uFFFD" {
		t.Fatalf("Flush = %q, want U+FFFD", got)
	}
	if got := d.Add('a'); got != "a" {
		t.Fatalf("Add after Flush = %q", got)
	}

	sp := newSP(t, spOptions{}, "")
	ds := sp.NewStreamDecoder(true)
	var outs []string
	for _, id := range []int32{1, spID("▁hello"), spByte(0xC3), spByte(0xA9), spID("▁world")} {
		outs = append(outs, ds.Add(id))
	}
	outs = append(outs, ds.Flush())
	want := []string{"", "hello", "", "é", " world", ""}
	if !slices.Equal(outs, want) {
		t.Fatalf("stream pieces %q, want %q", outs, want)
	}
}

func TestAppendValidUTF8(t *testing.T) {
	tests := []struct {
		in       string
		final    bool
		want     string
		consumed int
	}{
		{"abc", false, "abc", 3},
		{"é", false, "é", 2},
		{"\xC3", false, "", 0},
		{"\xC3", true, "\uFFFD", 1},
		{"a\xE2\x82", false, "a", 1},
		{"a\xE2\x82", true, "a\uFFFD", 3},
		{"\xE2\x82A", false, "\uFFFDA", 3},
		{"\x80\x80", false, "\uFFFD\uFFFD", 2},
		{"\xE0\x80", false, "\uFFFD\uFFFD", 2}, // E0 needs A0..BF next
		{"\xED\xA0\x80", false, "\uFFFD\uFFFD\uFFFD", 3},
		{"\xF0\x9F\x99", false, "", 0},
		{"\xF0\x9F\x99\x82", false, "🙂", 4},
		{"\xF5", false, "\uFFFD", 1},
		{"\uFFFD", false, "\uFFFD", 3},
	}
	for _, tc := range tests {
		out, n := appendValidUTF8(nil, []byte(tc.in), tc.final)
		if string(out) != tc.want || n != tc.consumed {
			t.Errorf("appendValidUTF8(%q, final=%v) = %q, %d; want %q, %d", tc.in, tc.final, out, n, tc.want, tc.consumed)
		}
	}
}

func TestSpecialTokensAndIDs(t *testing.T) {
	sp := newSP(t, spOptions{}, spConfig)
	bl := newBL(t, false)
	syn := newSynth(t, 1000)
	type want struct {
		vocab   int
		bos     int32
		hasBOS  bool
		eos     []int32
		lookups map[string]int32
	}
	tests := []struct {
		name string
		tk   *Tokenizer
		want want
	}{
		{"sentencepiece", sp, want{vocab: 279, bos: 1, hasBOS: true, eos: []int32{2}, lookups: map[string]int32{"<s>": 1, "▁hello": spID("▁hello"), "<0x41>": spByte('A')}}},
		{"byte-level without config", bl, want{vocab: 305, bos: blBOS, hasBOS: true, eos: []int32{blEOT}, lookups: map[string]int32{"Ġthe": blMergeID(2), "<|eot_id|>": blEOT}}},
		{"synthesized", syn, want{vocab: 1000, bos: 744, hasBOS: true, eos: []int32{745, 753}, lookups: map[string]int32{"<|begin_of_text|>": 744, "<|eot_id|>": 753, "<|start_header_id|>": 750, "<|reserved_special_token_5|>": 754}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.tk.VocabSize(); got != tc.want.vocab {
				t.Errorf("VocabSize = %d, want %d", got, tc.want.vocab)
			}
			bos, ok := tc.tk.BOS()
			if bos != tc.want.bos || ok != tc.want.hasBOS {
				t.Errorf("BOS = %d, %v; want %d, %v", bos, ok, tc.want.bos, tc.want.hasBOS)
			}
			if got := tc.tk.EOS(); !slices.Equal(got, tc.want.eos) {
				t.Errorf("EOS = %v, want %v", got, tc.want.eos)
			}
			for tok, id := range tc.want.lookups {
				if got, ok := tc.tk.TokenID(tok); !ok || got != id {
					t.Errorf("TokenID(%q) = %d, %v; want %d", tok, got, ok, id)
				}
				if got := tc.tk.Token(id); got != tok {
					t.Errorf("Token(%d) = %q, want %q", id, got, tok)
				}
			}
			if _, ok := tc.tk.TokenID("no such token"); ok {
				t.Error("TokenID found a token that does not exist")
			}
		})
	}
}

func TestConfigAddSpecial(t *testing.T) {
	hello := spID("▁hello")
	tests := []struct {
		name string
		cfg  string
		want []int32
	}{
		{"post-processor only", "", []int32{1, hello}},
		{"add_bos_token true", `{"add_bos_token": true, "bos_token": "<s>"}`, []int32{1, hello}},
		{"add_bos_token false", `{"add_bos_token": false, "bos_token": "<s>"}`, []int32{hello}},
		{"add_eos_token true", `{"add_eos_token": true, "eos_token": "</s>"}`, []int32{1, hello, 2}},
		{"eos as object", `{"add_eos_token": true, "eos_token": {"content": "</s>"}}`, []int32{1, hello, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk := newSP(t, spOptions{}, tc.cfg)
			if got := tk.Encode("hello", true); !slices.Equal(got, tc.want) {
				t.Errorf("Encode = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestChatTemplate(t *testing.T) {
	syn := newSynth(t, 1000)
	sp := newSP(t, spOptions{}, spConfig)
	plain := newSP(t, spOptions{}, "")
	listForm := newSP(t, spOptions{}, `{"chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "{{ messages | length }} messages"}]}`)
	raising := newSP(t, spOptions{}, `{"chat_template": "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok"}`)
	llama2 := newSP(t, spOptions{}, string(mustJSON(t, map[string]any{"bos_token": "<s>", "eos_token": "</s>", "chat_template": llama2ChatTemplate})))
	chatml := newSP(t, spOptions{}, string(mustJSON(t, map[string]any{"chat_template": chatMLTemplate})))
	msgs := []Message{{"system", "You are terse."}, {"user", "  Hi!  "}}
	tests := []struct {
		name   string
		tk     *Tokenizer
		msgs   []Message
		genPr  bool
		want   string
		hasTpl bool
	}{
		{"llama3", syn, msgs, true,
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n", true},
		{"llama3 no generation prompt", syn, msgs[1:], false,
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>", true},
		{"llama2 style", sp, []Message{{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}}, false,
			"<s>[INST] Hi [/INST] Hello </s><s>[INST] Bye [/INST]", true},
		{"fallback without template", plain, msgs, true, "system: You are terse.\nuser:   Hi!  \nassistant: ", false},
		{"fallback without generation prompt", plain, msgs[:1], false, "system: You are terse.\n", false},
		{"named template list", listForm, msgs, false, "2 messages", true},
		{"llama2 official", llama2, []Message{{"system", "Sys"}, {"user", " Hi "}, {"assistant", "Hello"}, {"user", "Bye"}}, true,
			"<s>[INST] <<SYS>>\nSys\n<</SYS>>\n\n Hi [/INST] Hello </s><s>[INST] Bye [/INST]", true},
		{"chatml", chatml, msgs[1:], true, "<|im_start|>user\n  Hi!  <|im_end|>\n<|im_start|>assistant\n", true},
		{"raise_exception not triggered", raising, msgs[1:], false, "ok", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.tk.HasChatTemplate(); got != tc.hasTpl {
				t.Errorf("HasChatTemplate = %v, want %v", got, tc.hasTpl)
			}
			got, err := tc.tk.ApplyChatTemplate(tc.msgs, tc.genPr)
			if err != nil {
				t.Fatalf("ApplyChatTemplate: %v", err)
			}
			if got != tc.want {
				t.Errorf("ApplyChatTemplate =\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
	t.Run("raise_exception", func(t *testing.T) {
		_, err := raising.ApplyChatTemplate(msgs, false)
		if !errors.Is(err, ErrTemplateException) || !strings.Contains(err.Error(), "System role not supported") {
			t.Fatalf("err = %v, want ErrTemplateException with the template's message", err)
		}
	})
	t.Run("llama2 rejects non-alternating roles", func(t *testing.T) {
		_, err := llama2.ApplyChatTemplate([]Message{{"user", "a"}, {"user", "b"}}, false)
		if !errors.Is(err, ErrTemplateException) || !strings.Contains(err.Error(), "alternate") {
			t.Fatalf("err = %v, want ErrTemplateException about alternation", err)
		}
	})
	t.Run("rendered prompt encodes specials", func(t *testing.T) {
		p, err := syn.ApplyChatTemplate(msgs[1:], true)
		if err != nil {
			t.Fatal(err)
		}
		ids := syn.Encode(p, false)
		bos, _ := syn.BOS()
		eot, _ := syn.TokenID("<|eot_id|>")
		if ids[0] != bos || !slices.Contains(ids, eot) {
			t.Fatalf("encoded prompt %v lacks BOS %d or <|eot_id|> %d", ids, bos, eot)
		}
		if got := syn.Decode(ids, false); got != p {
			t.Fatalf("prompt round trip %q != %q", got, p)
		}
	})
}

// llama2ChatTemplate is Llama 2 Chat's template as shipped in its
// tokenizer_config.json.
const llama2ChatTemplate = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`

// chatMLTemplate is the ChatML template (Qwen and others).
const chatMLTemplate = `{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

func TestStrftime(t *testing.T) {
	at := time.Date(2024, time.July, 5, 9, 3, 7, 0, time.UTC)
	tests := []struct{ format, want string }{
		{"%d %b %Y", "05 Jul 2024"},
		{"%Y-%m-%d %H:%M:%S", "2024-07-05 09:03:07"},
		{"%A %B %y", "Friday July 24"},
		{"100%% %q", "100% %q"},
		{"trailing %", "trailing %"},
	}
	for _, tc := range tests {
		if got := strftime(at, tc.format); got != tc.want {
			t.Errorf("strftime(%q) = %q, want %q", tc.format, got, tc.want)
		}
	}
}

func TestBadInput(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{
			"model": map[string]any{"type": "BPE", "vocab": map[string]int{"a": 0, "b": 1, "ab": 2}, "merges": []string{"a b"}},
		}
	}
	with := func(edit func(m map[string]any)) []byte {
		m := good()
		edit(m)
		return mustJSON(t, m)
	}
	model := func(m map[string]any) map[string]any { return m["model"].(map[string]any) }
	tests := []struct {
		name    string
		json    []byte
		cfg     []byte
		wantErr string
	}{
		{"malformed json", []byte(`{"model": {`), nil, "tokenizer.json: parse"},
		{"not an object", []byte(`[1,2]`), nil, "tokenizer.json: parse"},
		{"invalid UTF-8", []byte("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\xff\": 0}, \"merges\": []}}"), nil, "not valid UTF-8"},
		{"config invalid UTF-8", with(func(map[string]any) {}), []byte("{\"bos_token\": \"\xc3\"}"), "tokenizer_config.json: parse: not valid UTF-8"},
		{"bad escape in a key", []byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_f\llback": true}}`), nil, "tokenizer.json: parse"},
		{"config bad escape in a key", with(func(map[string]any) {}), []byte(`{"bos_t\oken": "<s>"}`), "tokenizer_config.json: parse"},
		{"no model", []byte(`{}`), nil, "model: missing"},
		{"unknown model type", with(func(m map[string]any) { model(m)["type"] = "WordPiece" }), nil, "model.type"},
		{"vocab not a map", with(func(m map[string]any) { model(m)["vocab"] = []int{1} }), nil, "model.vocab"},
		{"negative id", with(func(m map[string]any) { model(m)["vocab"] = map[string]int{"a": -1} }), nil, "model.vocab"},
		{"sparse ids", with(func(m map[string]any) { model(m)["vocab"] = map[string]int{"a": 0, "b": 1 << 20, "ab": 2} }), nil, "ids up to"},
		{"shared id", with(func(m map[string]any) { model(m)["vocab"] = map[string]int{"a": 0, "b": 0} }), nil, "share id"},
		{"merge names unknown token", with(func(m map[string]any) { model(m)["merges"] = []string{"a c"} }), nil, `model.merges[0]: token "c"`},
		{"merge result unknown", with(func(m map[string]any) { model(m)["merges"] = []string{"b a"} }), nil, `model.merges[0]: merged token "ba"`},
		{"merge without space", with(func(m map[string]any) { model(m)["merges"] = []string{"ab"} }), nil, "model.merges[0]"},
		{"merge pair of three", with(func(m map[string]any) { model(m)["merges"] = [][]string{{"a", "b", "c"}} }), nil, "model.merges[0]"},
		{"merges not a list", with(func(m map[string]any) { model(m)["merges"] = 7 }), nil, "model.merges"},
		{"merge forms mixed", with(func(m map[string]any) { model(m)["merges"] = []any{"a b", []string{"a", "b"}} }), nil, "model.merges[1]"},
		{"unk not in vocab", with(func(m map[string]any) { model(m)["unk_token"] = "<unk>" }), nil, "model.unk_token"},
		{"subword prefix", with(func(m map[string]any) { model(m)["continuing_subword_prefix"] = "##" }), nil, "model.continuing_subword_prefix"},
		{"bad regex", with(func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(\p{L}+`}, "behavior": "Isolated"},
			}}
		}), nil, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
		{"bad behavior", with(func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"}
		}), nil, "pre_tokenizer.behavior"},
		{"pattern missing", with(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Split", "behavior": "Isolated"} }), nil, "pre_tokenizer.pattern"},
		{"unknown pre-tokenizer", with(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "BertPreTokenizer"} }), nil, "pre_tokenizer.type"},
		{"component without type", with(func(m map[string]any) { m["decoder"] = map[string]any{"x": 1} }), nil, "decoder.type: missing"},
		{"unknown normalizer", with(func(m map[string]any) { m["normalizer"] = map[string]any{"type": "Precompiled"} }), nil, "normalizer.type"},
		{"bad normalizer regex", with(func(m map[string]any) {
			m["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"Regex": "["}, "content": ""}
		}), nil, "normalizer.pattern.Regex"},
		{"unknown decoder", with(func(m map[string]any) {
			m["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{map[string]any{"type": "WordPiece"}}}
		}), nil, "decoder.decoders[0].type"},
		{"unknown post-processor", with(func(m map[string]any) { m["post_processor"] = map[string]any{"type": "Magic"} }), nil, "post_processor.type"},
		{"template names unknown token", with(func(m map[string]any) {
			m["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}}}
		}), nil, "post_processor.single[0]"},
		{"added token bad id", with(func(m map[string]any) { m["added_tokens"] = []any{map[string]any{"id": -3, "content": "<x>"}} }), nil, "added_tokens[0].id"},
		{"added token empty", with(func(m map[string]any) { m["added_tokens"] = []any{map[string]any{"id": 3, "content": ""}} }), nil, "added_tokens[0].content"},
		{"config malformed", with(func(map[string]any) {}), []byte(`{"bos_token": `), "tokenizer_config.json: parse"},
		{"config bad token", with(func(map[string]any) {}), []byte(`{"eos_token": 5}`), "tokenizer_config.json: eos_token"},
		{"config bad template", with(func(map[string]any) {}), []byte(`{"chat_template": 5}`), "tokenizer_config.json: chat_template"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk, err := New(tc.json, tc.cfg)
			if err == nil {
				t.Fatalf("New succeeded (vocab %d), want error containing %q", tk.VocabSize(), tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tc.wantErr)
			}
		})
	}
	t.Run("good base parses", func(t *testing.T) {
		tk, err := New(mustJSON(t, good()), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := tk.Encode("ab", false); !slices.Equal(got, []int32{2}) {
			t.Fatalf("Encode(ab) = %v", got)
		}
	})
}

// TestCorruptedJSON flips bytes of valid tokenizer files. New must reject
// every file that is no longer JSON, never panic, and every file it still
// accepts must give a tokenizer that behaves consistently: the same
// encodings on every load, ids inside its vocabulary, and, when the
// corruption did not change what the JSON says (a space swapped for a
// space), exactly the original's encodings.
func TestCorruptedJSON(t *testing.T) {
	texts := []string{"hello world <s> the", " the thing in", "héllo\nwörld ✓"}
	encodeAll := func(tk *Tokenizer) [][]int32 {
		var out [][]int32
		for _, s := range texts {
			out = append(out, tk.Encode(s, true), tk.Encode(s, false))
		}
		return out
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, src := range []struct {
		name string
		json []byte
	}{
		{"sentencepiece", spJSON(t, spOptions{})},
		{"byte-level", blJSON(t, true, true)},
	} {
		t.Run(src.name, func(t *testing.T) {
			orig, err := New(src.json, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := encodeAll(orig)
			var origValue any
			if err := json.Unmarshal(src.json, &origValue); err != nil {
				t.Fatal(err)
			}
			var invalid, rejected, loaded, same int
			for i := range 200 {
				b := slices.Clone(src.json)
				for range 1 + rng.IntN(4) {
					b[rng.IntN(len(b))] = "{}[]\",:0a \\"[rng.IntN(11)]
				}
				valid := json.Valid(b)
				if !valid {
					invalid++
				}
				tk, err := New(b, nil)
				if err != nil {
					rejected++
					if tk != nil {
						t.Fatalf("corruption %d: New returned a tokenizer with error %v", i, err)
					}
					if err.Error() == "" {
						t.Fatalf("corruption %d: empty error", i)
					}
					continue
				}
				loaded++
				if !valid {
					t.Fatalf("corruption %d: New accepted a file that is not JSON:\n%s", i, b)
				}
				got := encodeAll(tk)
				again, err := New(b, nil)
				if err != nil {
					t.Fatalf("corruption %d: loads once, then fails: %v", i, err)
				}
				if !slices.EqualFunc(got, encodeAll(again), slices.Equal) {
					t.Fatalf("corruption %d: two loads of one file encode differently", i)
				}
				for _, ids := range got {
					for _, id := range ids {
						if id < 0 || int(id) >= tk.VocabSize() {
							t.Fatalf("corruption %d: id %d outside the vocabulary of %d", i, id, tk.VocabSize())
						}
					}
					if text := tk.Decode(ids, false); !utf8.ValidString(text) {
						t.Fatalf("corruption %d: Decode(%v) = %q is not valid UTF-8", i, ids, text)
					}
				}
				var v any
				if err := json.Unmarshal(b, &v); err != nil {
					t.Fatal(err)
				}
				if reflect.DeepEqual(v, origValue) {
					same++
					if !slices.EqualFunc(got, want, slices.Equal) {
						t.Fatalf("corruption %d says what the original says but encodes %v, not %v", i, got, want)
					}
				}
			}
			t.Logf("200 corruptions: %d not JSON, %d rejected, %d loaded (%d meaning the same as the original)", invalid, rejected, loaded, same)
			if invalid == 0 {
				t.Fatal("no corruption broke the JSON: the test no longer exercises rejection")
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Run("missing tokenizer.json", func(t *testing.T) {
		_, err := Load(t.TempDir())
		if !errors.Is(err, ErrNoTokenizer) {
			t.Fatalf("err = %v, want ErrNoTokenizer", err)
		}
	})
	t.Run("stories260K without its tokenizer", func(t *testing.T) {
		dir := testmodel.WithoutTokenizer(t)
		if _, err := Load(dir); !errors.Is(err, ErrNoTokenizer) {
			t.Fatalf("Load(%s) err = %v, want ErrNoTokenizer", dir, err)
		}
	})
	t.Run("stories260K tokenizer", func(t *testing.T) {
		// The golden ids came from llama2.c's tokenizer, independently of
		// this one: "once" is BOS and "Once upon a time", and the greedy
		// story from BOS is the model's well-known text.
		dir := testmodel.Dir(t)
		tk, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		bos, hasBOS := tk.BOS()
		if tk.VocabSize() != 512 || bos != 1 || !hasBOS || !slices.Contains(tk.EOS(), 2) || !tk.HasChatTemplate() {
			t.Fatalf("vocab %d, BOS %d (%v), EOS %v, chat template %v", tk.VocabSize(), bos, hasBOS, tk.EOS(), tk.HasChatTemplate())
		}
		once := testmodel.GoldenCase(t, "once")
		if got := tk.Encode("Once upon a time", true); !slices.Equal(got, once.PromptIDs) {
			t.Errorf("Encode(Once upon a time) = %v, want the golden prompt %v", got, once.PromptIDs)
		}
		story := tk.Decode(testmodel.GoldenCase(t, "bos").Completion, true)
		if !strings.HasPrefix(story, testmodel.StoryStart) {
			t.Errorf("the golden story decodes to %q, want it to start %q", story, testmodel.StoryStart)
		}
	})
	t.Run("synthesized files", func(t *testing.T) {
		dir := t.TempDir()
		tj, cj, err := Synthesize(512, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cj, 0o644); err != nil {
			t.Fatal(err)
		}
		tk, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if tk.VocabSize() != 512 || !tk.HasChatTemplate() {
			t.Fatalf("VocabSize %d, chat template %v", tk.VocabSize(), tk.HasChatTemplate())
		}
	})
	t.Run("chat_template.jinja", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), spJSON(t, spOptions{}), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("{% for m in messages %}[{{ m.role }}]{% endfor %}"), 0o644); err != nil {
			t.Fatal(err)
		}
		tk, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tk.ApplyChatTemplate([]Message{{"user", "x"}}, false)
		if err != nil || got != "[user]" {
			t.Fatalf("ApplyChatTemplate = %q, %v", got, err)
		}
	})
	t.Run("broken tokenizer.json names the file", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || errors.Is(err, ErrNoTokenizer) || !strings.Contains(err.Error(), dir) {
			t.Fatalf("err = %v, want a parse error naming %s", err, dir)
		}
	})
}

func TestSynthesize(t *testing.T) {
	for _, n := range []int{300, 767, 768, 32000, 128256} {
		a1, c1, err := Synthesize(n, 42)
		if err != nil {
			t.Fatalf("Synthesize(%d): %v", n, err)
		}
		a2, c2, err := Synthesize(n, 42)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a1, a2) || !slices.Equal(c1, c2) {
			t.Fatalf("Synthesize(%d, 42) differs between calls", n)
		}
		tk, err := New(a1, c1)
		if err != nil {
			t.Fatalf("New(Synthesize(%d)): %v", n, err)
		}
		if tk.VocabSize() != n {
			t.Fatalf("VocabSize = %d, want %d", tk.VocabSize(), n)
		}
		for id := int32(0); id < int32(n); id++ {
			if !tk.hasToken[id] {
				t.Fatalf("vocab %d: id %d has no token", n, id)
			}
		}
		bos, _ := tk.BOS()
		eot, ok := tk.TokenID("<|eot_id|>")
		if !ok || !tk.IsSpecial(eot) || !tk.IsSpecial(bos) {
			t.Fatalf("vocab %d: specials missing (bos %d, eot %d %v)", n, bos, eot, ok)
		}
		s := "The miller thanked the children, and they baked bread."
		ids := tk.Encode(s, false)
		if len(ids) >= len(s) {
			t.Errorf("vocab %d: %d tokens for %d bytes: merges are not doing anything", n, len(ids), len(s))
		}
	}
	t.Run("llama3 layout", func(t *testing.T) {
		tk := newSynth(t, 128256)
		for tok, id := range map[string]int32{"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006, "<|end_header_id|>": 128007, "<|eot_id|>": 128009, "<|reserved_special_token_250|>": 128255} {
			if got, ok := tk.TokenID(tok); !ok || got != id {
				t.Errorf("TokenID(%q) = %d, %v; want %d", tok, got, ok, id)
			}
		}
	})
	t.Run("seed matters", func(t *testing.T) {
		a, _, _ := Synthesize(5000, 1)
		b, _, _ := Synthesize(5000, 2)
		if slices.Equal(a, b) {
			t.Fatal("different seeds gave the same tokenizer")
		}
	})
	t.Run("too small", func(t *testing.T) {
		if _, _, err := Synthesize(299, 1); err == nil {
			t.Fatal("Synthesize(299) succeeded")
		}
	})
}

// TestConcurrentUse exercises one tokenizer from many goroutines (run with
// -race); results must match the sequential ones.
func TestConcurrentUse(t *testing.T) {
	tk := newSynth(t, 4000)
	rng := rand.New(rand.NewPCG(5, 6))
	texts := make([]string, 40)
	want := make([][]int32, len(texts))
	for i := range texts {
		texts[i] = randomText(rng, 60) + " the bread and the boats"
		want[i] = tk.Encode(texts[i], true)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range texts {
				j := (i + g) % len(texts)
				if got := tk.Encode(texts[j], true); !slices.Equal(got, want[j]) {
					errs <- "encode mismatch for " + texts[j]
					return
				}
				if got := tk.Decode(want[j], true); got != texts[j] {
					errs <- "decode mismatch for " + texts[j]
					return
				}
				if _, err := tk.ApplyChatTemplate([]Message{{"user", texts[j]}}, true); err != nil {
					errs <- err.Error()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestEncodeInvalidUTF8(t *testing.T) {
	kinds := map[string]*Tokenizer{
		"sentencepiece": newSP(t, spOptions{}, ""),
		"byte-level":    newBL(t, false),
		"synthesized":   newSynth(t, 1000),
	}
	for name, tk := range kinds {
		t.Run(name, func(t *testing.T) {
			ids := tk.Encode("a\xffb\xe2\x82", false)
			if got := tk.Decode(ids, false); got != "a\uFFFDb\uFFFD" {
				t.Fatalf("Decode(Encode(invalid)) = %q (ids %v)", got, ids)
			}
		})
	}
}

// TestMergeErrorNamesFirst checks that when merges are resolved in chunks
// across goroutines, the error still names the lowest-ranked bad merge.
func TestMergeErrorNamesFirst(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	raw, _, err := Synthesize(128256, 1)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	merges := m["model"].(map[string]any)["merges"].([]any)
	if len(merges) < 4*mergeChunk {
		t.Fatalf("only %d merges: too few to resolve in chunks", len(merges))
	}
	first, later := len(merges)/2+7, len(merges)-3
	merges[later] = "nosuch1 nosuch2"
	merges[first] = "nosuch3 nosuch4"
	_, err = New(mustJSON(t, m), nil)
	if want := fmt.Sprintf(`model.merges[%d]: token "nosuch3"`, first); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to name %s", err, want)
	}
}

// TestTokenBytes checks that a token's bytes are its raw bytes: a
// byte-fallback or byte-level token for one byte of a longer character is
// that byte, never U+FFFD, and a word keeps its leading space.
func TestTokenBytes(t *testing.T) {
	stories, err := Load(testmodel.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	tj, cj, err := Synthesize(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	synth, err := New(tj, cj)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		tk    *Tokenizer
		token string // the spelling in tokenizer.json
		want  []byte
	}{
		{"byte fallback, first byte of ’", stories, "<0xE2>", []byte{0xE2}},
		{"byte fallback, continuation byte", stories, "<0x80>", []byte{0x80}},
		{"byte fallback, ASCII", stories, "<0x41>", []byte("A")},
		{"SentencePiece word keeps its space", stories, "▁the", []byte(" the")},
		{"special token", stories, "</s>", []byte("</s>")},
		{"byte-level, first byte of ’", synth, "â", []byte{0xE2}},
		{"byte-level space", synth, "Ġ", []byte(" ")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := tc.tk.TokenID(tc.token)
			if !ok {
				t.Fatalf("no token %q", tc.token)
			}
			if got := tc.tk.TokenBytes(id); !bytes.Equal(got, tc.want) {
				t.Fatalf("TokenBytes(%d %q) = %v, want %v", id, tc.token, got, tc.want)
			}
		})
	}
	for _, id := range []int32{-1, int32(stories.VocabSize())} {
		if got := stories.TokenBytes(id); got != nil {
			t.Errorf("TokenBytes(%d) = %v, want nil", id, got)
		}
	}
	// Where a token alone decodes to whole characters, its bytes are the
	// decoded text (bar the leading space Decode strips at the start).
	for id := range int32(stories.VocabSize()) {
		b := stories.TokenBytes(id)
		if !utf8.Valid(b) {
			continue
		}
		if got, want := stories.Decode([]int32{id}, false), strings.TrimPrefix(string(b), " "); got != want {
			t.Errorf("token %d: Decode %q, TokenBytes %q", id, got, b)
		}
	}
}
