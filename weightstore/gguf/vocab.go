package gguf

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Token types of llama.cpp's vocabulary (tokenizer.ggml.token_type).
const (
	TokenNormal      int32 = 1
	TokenUnknown     int32 = 2
	TokenControl     int32 = 3
	TokenUserDefined int32 = 4
	TokenUnused      int32 = 5
	TokenByte        int32 = 6
)

// llama3Split is the pre-tokenizer regex of Llama 3, which llama.cpp calls
// the "llama-bpe" pre-tokenizer.
const llama3Split = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// tokenizerJSON is the part of a Hugging Face tokenizer.json the export
// reads.
type tokenizerJSON struct {
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Decoder      json.RawMessage `json:"decoder"`
	Model        struct {
		Type         string            `json:"type"`
		Vocab        map[string]int    `json:"vocab"`
		Merges       []json.RawMessage `json:"merges"`
		ByteFallback bool              `json:"byte_fallback"`
		UnkToken     *string           `json:"unk_token"`
	} `json:"model"`
}

// Vocab builds the tokenizer.ggml.* metadata for a vocabulary of
// vocabSize ids (the model's embedding rows) from a tokenizer.json: a
// byte-level BPE (GPT-2, Llama 3) becomes llama.cpp's "gpt2" model with its
// merges, a SentencePiece-style BPE with byte fallback (Llama 2) becomes the
// "llama" model with scores ranking tokens by the merge that makes them.
// Ids the tokenizer does not name are padding tokens of type unused.
// bos and eos (-1: none) are the config's token ids.
func Vocab(tokenizerJSONData []byte, vocabSize, bos int, eos []int) ([]KV, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(tokenizerJSONData, &tj); err != nil {
		return nil, fmt.Errorf("build vocabulary: parse tokenizer.json: %w", err)
	}
	if tj.Model.Type != "BPE" {
		return nil, fmt.Errorf("build vocabulary: tokenizer model %q is not supported (want BPE)", tj.Model.Type)
	}
	tokens := make([]string, vocabSize)
	types := make([]int32, vocabSize)
	set := make([]bool, vocabSize)
	put := func(id int, s string, typ int32) error {
		if id < 0 || id >= vocabSize {
			return fmt.Errorf("build vocabulary: token %q has id %d outside the model's %d embeddings", s, id, vocabSize)
		}
		tokens[id], types[id], set[id] = s, typ, true
		return nil
	}
	for s, id := range tj.Model.Vocab {
		if err := put(id, s, TokenNormal); err != nil {
			return nil, err
		}
	}
	for _, a := range tj.AddedTokens {
		typ := TokenUserDefined
		if a.Special {
			typ = TokenControl
		}
		if err := put(a.ID, a.Content, typ); err != nil {
			return nil, err
		}
	}
	for id := range tokens {
		if !set[id] {
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), TokenUnused
		}
	}
	merges, err := parseMerges(tj.Model.Merges)
	if err != nil {
		return nil, fmt.Errorf("build vocabulary: %w", err)
	}

	byteLevel := strings.Contains(string(tj.PreTokenizer), `"ByteLevel"`) || strings.Contains(string(tj.Decoder), `"ByteLevel"`)
	var kvs []KV
	switch {
	case byteLevel:
		pre := "default"
		if strings.Contains(string(tj.PreTokenizer), jsonQuote(llama3Split)) {
			pre = "llama-bpe"
		}
		joined := make([]string, len(merges))
		for i, m := range merges {
			joined[i] = m[0] + " " + m[1]
		}
		kvs = append(kvs,
			KV{"tokenizer.ggml.model", "gpt2"},
			KV{"tokenizer.ggml.pre", pre},
			KV{"tokenizer.ggml.tokens", tokens},
			KV{"tokenizer.ggml.token_type", types},
			KV{"tokenizer.ggml.merges", joined},
		)
	case tj.Model.ByteFallback:
		// Score a token by the rank of the merge that makes it, so
		// llama.cpp's highest-score-first merging follows the BPE order;
		// tokens no merge makes rank below all that one does.
		index := make(map[string]int, len(tokens))
		for id, s := range tokens {
			index[s] = id
		}
		scores := make([]float32, vocabSize)
		for i := range scores {
			scores[i] = -1e9
		}
		for rank, m := range merges {
			if id, ok := index[m[0]+m[1]]; ok && scores[id] == -1e9 {
				scores[id] = -float32(rank + 1)
			}
		}
		byteTok := regexp.MustCompile(`^<0x[0-9A-F]{2}>$`)
		for id, s := range tokens {
			switch {
			case types[id] == TokenNormal && byteTok.MatchString(s):
				types[id] = TokenByte
				scores[id] = 0
			case tj.Model.UnkToken != nil && s == *tj.Model.UnkToken:
				types[id] = TokenUnknown
				scores[id] = 0
				kvs = append(kvs, KV{"tokenizer.ggml.unknown_token_id", uint32(id)})
			case types[id] != TokenNormal:
				scores[id] = 0
			}
		}
		kvs = append(kvs,
			KV{"tokenizer.ggml.model", "llama"},
			KV{"tokenizer.ggml.pre", "default"},
			KV{"tokenizer.ggml.tokens", tokens},
			KV{"tokenizer.ggml.scores", scores},
			KV{"tokenizer.ggml.token_type", types},
		)
	default:
		return nil, fmt.Errorf("build vocabulary: a BPE tokenizer with neither a ByteLevel pre-tokenizer nor byte fallback is not supported")
	}
	if bos >= 0 {
		if bos >= vocabSize {
			return nil, fmt.Errorf("build vocabulary: bos id %d is outside the %d tokens", bos, vocabSize)
		}
		kvs = append(kvs, KV{"tokenizer.ggml.bos_token_id", uint32(bos)}, KV{"tokenizer.ggml.add_bos_token", true})
	}
	if len(eos) > 0 {
		if eos[0] < 0 || eos[0] >= vocabSize {
			return nil, fmt.Errorf("build vocabulary: eos id %d is outside the %d tokens", eos[0], vocabSize)
		}
		kvs = append(kvs, KV{"tokenizer.ggml.eos_token_id", uint32(eos[0])})
	}
	return kvs, nil
}

// parseMerges reads tokenizer.json merges in either spelling: "a b"
// strings or ["a", "b"] pairs.
func parseMerges(raw []json.RawMessage) ([][2]string, error) {
	out := make([][2]string, len(raw))
	for i, r := range raw {
		var s string
		if err := json.Unmarshal(r, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("merge %d %q has no space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("merge %d is neither \"a b\" nor a pair of strings: %s", i, r)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

// jsonQuote is s as a JSON string, for finding it in raw JSON.
func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
