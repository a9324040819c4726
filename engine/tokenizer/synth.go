package tokenizer

import (
	"bytes"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"unicode/utf8"
)

// synthCorpus is a few KB of plain English the synthetic tokenizer learns
// its first merges from.
//
//go:embed corpus.txt
var synthCorpus string

// llama3Pattern is Llama 3's pre-tokenizer split.
const llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// llama3ChatTemplate is Llama 3 Instruct's chat template.
const llama3ChatTemplate = `{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}`

// synthSpecials names the first entries of the Llama 3 special-token block;
// the rest of the block is reserved tokens.
var synthSpecials = []string{
	"<|begin_of_text|>", "<|end_of_text|>",
	"<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
	"<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
	"<|start_header_id|>", "<|end_header_id|>",
	"<|reserved_special_token_4|>", "<|eot_id|>",
}

// Synthesize writes a byte-level BPE tokenizer.json and tokenizer_config.json
// in the Llama 3 layout with exactly vocabSize (>= 300) token ids: the 256
// byte tokens, merges learned from a small built-in English text and then
// filled with deterministic (seeded) merges of existing tokens, and a block
// of special tokens at the top (256 ids like Llama 3 when vocabSize >= 768,
// else 10). The same arguments always give the same bytes.
func Synthesize(vocabSize int, seed int64) (tokenizerJSON, tokenizerConfigJSON []byte, err error) {
	if vocabSize < 300 {
		return nil, nil, fmt.Errorf("synthesize tokenizer: vocab size %d is below 300", vocabSize)
	}
	if vocabSize > maxTokenID {
		return nil, nil, fmt.Errorf("synthesize tokenizer: vocab size %d is above %d", vocabSize, maxTokenID)
	}
	nSpecial := len(synthSpecials)
	if vocabSize >= 768 {
		nSpecial = 256
	}
	regular := vocabSize - nSpecial

	tokens, merges, err := synthMerges(regular, seed)
	if err != nil {
		return nil, nil, fmt.Errorf("synthesize tokenizer: %w", err)
	}
	specials := make([]string, nSpecial)
	for i := range specials {
		if i < len(synthSpecials) {
			specials[i] = synthSpecials[i]
		} else {
			specials[i] = "<|reserved_special_token_" + strconv.Itoa(i-len(synthSpecials)+5) + "|>"
		}
	}
	bos := specials[0]

	var b bytes.Buffer
	b.Grow(regular*24 + len(merges)*20)
	b.WriteString(`{"version":"1.0","truncation":null,"padding":null,"added_tokens":[`)
	for i, s := range specials {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":%d,"content":`, regular+i)
		writeJSONString(&b, s)
		b.WriteString(`,"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}`)
	}
	b.WriteString(`],"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":`)
	writeJSONString(&b, llama3Pattern)
	b.WriteString(`},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},`)
	b.WriteString(`"post_processor":{"type":"Sequence","processors":[{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":`)
	writeJSONString(&b, bos)
	b.WriteString(`,"type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[{"SpecialToken":{"id":`)
	writeJSONString(&b, bos)
	b.WriteString(`,"type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":`)
	writeJSONString(&b, bos)
	b.WriteString(`,"type_id":1}},{"Sequence":{"id":"B","type_id":1}}],"special_tokens":{`)
	writeJSONString(&b, bos)
	b.WriteString(`:{"id":`)
	writeJSONString(&b, bos)
	fmt.Fprintf(&b, `,"ids":[%d],"tokens":[`, regular)
	writeJSONString(&b, bos)
	b.WriteString(`]}}}]},"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},`)
	b.WriteString(`"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":true,"vocab":{`)
	spelled := make([]string, len(tokens))
	for id, raw := range tokens {
		spelled[id] = byteLevel.encode(raw)
		if id > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, spelled[id])
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(id))
	}
	b.WriteString(`},"merges":[`)
	for i, m := range merges {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, spelled[m[0]]+" "+spelled[m[1]])
	}
	b.WriteString("]}}\n")
	tokenizerJSON = b.Bytes()

	var c bytes.Buffer
	c.WriteString("{\n  \"bos_token\": ")
	writeJSONString(&c, bos)
	c.WriteString(",\n  \"eos_token\": ")
	writeJSONString(&c, specials[1])
	c.WriteString(",\n  \"chat_template\": ")
	writeJSONString(&c, llama3ChatTemplate)
	c.WriteString(",\n  \"clean_up_tokenization_spaces\": true,\n  \"model_input_names\": [\"input_ids\", \"attention_mask\"],\n")
	fmt.Fprintf(&c, "  \"model_max_length\": 131072,\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n")
	return tokenizerJSON, c.Bytes(), nil
}

// synthMerges returns n regular tokens (raw bytes, id = index; the first 256
// are the bytes) and the merges that build them, as id pairs in rank order.
func synthMerges(n int, seed int64) (tokens []string, merges [][2]int32, err error) {
	tokens = make([]string, 256, n)
	index := make(map[string]int32, n)
	for b := 0; b < 256; b++ {
		tokens[b] = string([]byte{byte(b)})
		index[tokens[b]] = int32(b)
	}
	add := func(a, b int32) {
		s := tokens[a] + tokens[b]
		if _, ok := index[s]; !ok {
			index[s] = int32(len(tokens))
			tokens = append(tokens, s)
		}
		merges = append(merges, [2]int32{a, b})
	}

	// Learn merges from the corpus: count pre-tokens, then repeatedly merge
	// the most frequent adjacent pair (ties: the smallest pair of ids).
	re, err := compileRegex(llama3Pattern, "synthesize")
	if err != nil {
		return nil, nil, err
	}
	spans, err := re.FindAllStringIndex(synthCorpus, -1)
	if err != nil {
		return nil, nil, fmt.Errorf("split corpus: %w", err)
	}
	freq := map[string]int{}
	for _, sp := range spans {
		freq[synthCorpus[sp[0]:sp[1]]]++
	}
	type word struct {
		syms []int32
		n    int
	}
	keys := make([]string, 0, len(freq))
	for k := range freq {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	words := make([]word, len(keys))
	for i, k := range keys {
		syms := make([]int32, len(k))
		for j := 0; j < len(k); j++ {
			syms[j] = int32(k[j])
		}
		words[i] = word{syms, freq[k]}
	}
	counts := map[uint64]int{}
	for len(tokens) < n {
		clear(counts)
		for _, w := range words {
			for j := 0; j+1 < len(w.syms); j++ {
				counts[pairKey(w.syms[j], w.syms[j+1])] += w.n
			}
		}
		var best uint64
		bestN := 0
		for k, c := range counts {
			if c > bestN || (c == bestN && k < best) {
				best, bestN = k, c
			}
		}
		if bestN < 2 {
			break
		}
		a, b := int32(best>>32), int32(uint32(best))
		add(a, b)
		id := index[tokens[a]+tokens[b]]
		for wi := range words {
			s := words[wi].syms
			out := s[:0]
			for j := 0; j < len(s); j++ {
				if j+1 < len(s) && s[j] == a && s[j+1] == b {
					out = append(out, id)
					j++
					continue
				}
				out = append(out, s[j])
			}
			words[wi].syms = out
		}
	}

	// Fill: glue a letter onto a word-like token (" the" + "n"), picking
	// with a seeded generator, until the vocabulary is full.
	var pool []int32
	wordLike := func(s string) bool {
		if len(s) > 0 && s[0] == ' ' {
			s = s[1:]
		}
		if s == "" {
			return false
		}
		for i := 0; i < len(s); i++ {
			if s[i] < 'a' || s[i] > 'z' {
				return false
			}
		}
		return true
	}
	for id, s := range tokens {
		if wordLike(s) {
			pool = append(pool, int32(id))
		}
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed70c3))
	const maxLen = 12
	for misses := 0; len(tokens) < n; {
		a := pool[rng.IntN(len(pool))]
		b := int32('a' + rng.IntN(26))
		if misses > 64 {
			// Crowded: glue two pool tokens instead.
			b = pool[rng.IntN(len(pool))]
			if tokens[b][0] == ' ' {
				continue
			}
		}
		s := tokens[a] + tokens[b]
		if _, ok := index[s]; ok || len(s) > maxLen || !utf8.ValidString(s) {
			misses++
			continue
		}
		misses = 0
		add(a, b)
		pool = append(pool, index[s])
	}
	return tokens, merges, nil
}

// writeJSONString writes s (valid UTF-8) as a JSON string.
func writeJSONString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\t':
			b.WriteString(`\t`)
		case c == '\r':
			b.WriteString(`\r`)
		case c < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}
