package openai

import (
	"bytes"
	"encoding/json"
)

// Prompt is the completions "prompt": a string, an array of strings, an
// array of token ids, or an array of such arrays. Exactly one of Texts and
// Tokens is set after a successful decode.
type Prompt struct {
	Texts  []string
	Tokens [][]int32
}

// Len is the number of prompts given.
func (p Prompt) Len() int { return len(p.Texts) + len(p.Tokens) }

// UnmarshalJSON accepts every prompt shape the OpenAI API allows.
func (p *Prompt) UnmarshalJSON(b []byte) error {
	bad := &FieldError{Field: "prompt", Reason: "must be a string, an array of strings, an array of token ids or an array of token id arrays"}
	*p = Prompt{}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil
	}
	switch b[0] {
	case '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return bad
		}
		p.Texts = []string{s}
		return nil
	case '[':
	default:
		return bad
	}
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return bad
	}
	if len(items) == 0 {
		return &FieldError{Field: "prompt", Reason: "must not be an empty array"}
	}
	switch first := bytes.TrimSpace(items[0]); {
	case len(first) > 0 && first[0] == '"':
		if err := json.Unmarshal(b, &p.Texts); err != nil {
			return &FieldError{Field: "prompt", Reason: "mixes strings with other values"}
		}
	case len(first) > 0 && first[0] == '[':
		if err := json.Unmarshal(b, &p.Tokens); err != nil {
			return &FieldError{Field: "prompt", Reason: "must hold arrays of integer token ids"}
		}
	default:
		var ids []int32
		if err := json.Unmarshal(b, &ids); err != nil {
			return &FieldError{Field: "prompt", Reason: "must be an array of integer token ids (32-bit)"}
		}
		p.Tokens = [][]int32{ids}
	}
	return nil
}

// MarshalJSON writes the most compact shape that says the same.
func (p Prompt) MarshalJSON() ([]byte, error) {
	switch {
	case len(p.Texts) == 1:
		return json.Marshal(p.Texts[0])
	case len(p.Texts) > 1:
		return json.Marshal(p.Texts)
	case len(p.Tokens) == 1:
		return json.Marshal(p.Tokens[0])
	case len(p.Tokens) > 1:
		return json.Marshal(p.Tokens)
	}
	return []byte("null"), nil
}

// StringList is a field that takes a string or an array of strings, like
// "stop".
type StringList []string

// UnmarshalJSON accepts null, a string or an array of strings.
func (s *StringList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*s = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return &FieldError{Field: "stop", Reason: "must be a string or an array of strings"}
		}
		*s = StringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &FieldError{Field: "stop", Reason: "must be a string or an array of strings"}
	}
	*s = many
	return nil
}

// Content is a chat message's "content": a string, an array of content
// parts, or null.
type Content struct {
	// Text is the string form, or the text parts joined.
	Text string
	// Parts is set when the content came as an array.
	Parts []ContentPart
}

// ContentPart is one element of an array content.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
}

// UnmarshalJSON accepts a string, null or an array of parts; Text then
// joins the text parts with newlines (as vLLM does).
func (c *Content) UnmarshalJSON(b []byte) error {
	*c = Content{}
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &c.Text); err != nil {
			return &FieldError{Field: "messages.content", Reason: "must be a string or an array of content parts"}
		}
		return nil
	}
	if err := json.Unmarshal(b, &c.Parts); err != nil {
		return &FieldError{Field: "messages.content", Reason: "must be a string or an array of content parts"}
	}
	var buf bytes.Buffer
	for i, p := range c.Parts {
		if p.Type != "text" {
			continue
		}
		if i > 0 && buf.Len() > 0 {
			buf.WriteByte('\n')
		}
		buf.WriteString(p.Text)
	}
	c.Text = buf.String()
	return nil
}

// MarshalJSON writes the parts when there are any, else the string.
func (c Content) MarshalJSON() ([]byte, error) {
	if c.Parts != nil {
		return json.Marshal(c.Parts)
	}
	return json.Marshal(c.Text)
}
