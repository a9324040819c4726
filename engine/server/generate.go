package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/kvcache"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/internal/openai"
)

// job is one admitted generation request.
type job struct {
	engine       *core.Engine
	params       core.Params
	stream       bool
	includeUsage bool
	format       format
}

// format shapes engine output as one endpoint's responses.
type format interface {
	// first is the chunk streamed before any output, or nil.
	first() any
	// scored receives the prompt's logprobs (core.Delta.PromptLogprobs),
	// for a completion that echoes its prompt.
	scored(lps []sample.Logprobs)
	// held reports whether the format holds output of its own (an echoed
	// prompt) that the next chunk must carry even without new text.
	held() bool
	// chunk is a streamed delta; finish is nil until the last.
	chunk(text string, ids []int32, lps []sample.Logprobs, finish *string) any
	// usage is the closing chunk of stream_options.include_usage.
	usage(u *openai.Usage) any
	// final is the whole non-streamed response.
	final(text string, ids []int32, lps []sample.Logprobs, finish string, u *openai.Usage) any
}

// head holds what every response of one request repeats.
type head struct {
	id      string
	created int64
	model   string
	tok     *tokenizer.Tokenizer
	// logprobs is sample.Params.Logprobs: -1 when not asked for.
	logprobs int
}

func newHead(prefix string, l *Loaded, logprobs int) head {
	return head{id: prefix + strconv.FormatUint(rand.Uint64(), 16), created: time.Now().Unix(), model: l.Name, tok: l.Tokenizer, logprobs: logprobs}
}

// token is how a token is shown in logprobs: its text and its raw bytes
// (the tokenizer's, never the replacement character of a partial UTF-8
// character). A token whose bytes are not valid UTF-8 on their own, like
// the byte-fallback token <0xE2>, is written the way OpenAI writes one:
// "bytes:\xe2", so alternatives that are different bytes stay different
// strings. Without a tokenizer the text is "token_id:N" (as vLLM writes
// it) and the bytes are nil (null: none known).
func (h *head) token(id int32) (string, []byte) {
	if h.tok == nil {
		return "token_id:" + strconv.FormatInt(int64(id), 10), nil
	}
	raw := h.tok.TokenBytes(id)
	if utf8.Valid(raw) {
		return string(raw), raw
	}
	var sb strings.Builder
	sb.WriteString("bytes:")
	for b := raw; len(b) > 0; {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size <= 1 {
			fmt.Fprintf(&sb, "\\x%02x", b[0])
			size = 1
		} else {
			sb.Write(b[:size])
		}
		b = b[size:]
	}
	return sb.String(), raw
}

func (s *Server) completions(c *gin.Context) {
	var req openai.CompletionRequest
	l, eng, ok := s.admit(c, &req, &req.Model)
	if !ok {
		return
	}
	defer s.release()
	if e := req.CheckSupported(); e != nil {
		writeError(c, e)
		return
	}
	var prompt []int32
	if len(req.Prompt.Texts) > 0 {
		if l.Tokenizer == nil {
			writeError(c, openai.InvalidRequest("prompt", "prompt is text but model %s has no tokenizer: send token ids", l.Name))
			return
		}
		var e *openai.Error
		if prompt, e = encodeText(l, req.Prompt.Texts[0], true, "prompt"); e != nil {
			writeError(c, e)
			return
		}
	} else {
		prompt = req.Prompt.Tokens[0]
	}
	logprobs := -1
	if req.Logprobs != nil {
		logprobs = *req.Logprobs
	}
	params, e := buildParams(l, &req.GenerationParams, prompt, genSpec{promptParam: "prompt", maxTokens: req.MaxTokens,
		maxParam: "max_tokens", defaultMax: 16, logprobs: logprobs, logprobsParam: "logprobs", kvTokens: kvTokens(eng), echo: req.Echo})
	params.Adapter = adapterOf(l, req.Model)
	if e == nil {
		e = headerPriority(c, &params)
	}
	if e != nil {
		writeError(c, e)
		return
	}
	f := &completionFormat{head: newHead("cmpl-", l, logprobs).as(l, req.Model)}
	if req.Echo {
		// The prompt's logprobs come from the engine, scored as it
		// computes the prompt.
		params.PromptLogprobs = logprobs >= 0
		text := ""
		switch {
		case len(req.Prompt.Texts) > 0:
			text = req.Prompt.Texts[0]
		case l.Tokenizer != nil:
			text = l.Tokenizer.Decode(prompt, params.SkipSpecial)
		}
		f.echo = newEchoed(&f.head, text, prompt, params.SkipSpecial)
		f.offset = f.echo.end
	}
	s.generate(c, &job{engine: eng, params: params, stream: req.Stream, includeUsage: req.IncludeUsage(), format: f})
}

func (s *Server) chatCompletions(c *gin.Context) {
	var req openai.ChatCompletionRequest
	l, eng, ok := s.admit(c, &req, &req.Model)
	if !ok {
		return
	}
	defer s.release()
	if e := req.CheckSupported(); e != nil {
		writeError(c, e)
		return
	}
	prompt, e := chatPrompt(l, req.Messages, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt, false)
	if e != nil {
		writeError(c, e)
		return
	}
	logprobs := -1
	if req.Logprobs {
		logprobs = 0
		if req.TopLogprobs != nil {
			logprobs = *req.TopLogprobs
		}
	}
	maxTokens, maxParam := req.MaxNewTokens()
	params, e := buildParams(l, &req.GenerationParams, prompt, genSpec{promptParam: "messages", maxTokens: maxTokens,
		maxParam: maxParam, logprobs: logprobs, logprobsParam: "top_logprobs", kvTokens: kvTokens(eng)})
	params.Adapter = adapterOf(l, req.Model)
	if e == nil {
		e = headerPriority(c, &params)
	}
	if e != nil {
		writeError(c, e)
		return
	}
	s.generate(c, &job{engine: eng, params: params, stream: req.Stream, includeUsage: req.IncludeUsage(),
		format: &chatFormat{head: newHead("chatcmpl-", l, logprobs).as(l, req.Model)}})
}

// headerPriority applies the priority the platform's activator set in
// engineapi.PriorityHeader, which overrides the body's.
func headerPriority(c *gin.Context, p *core.Params) *openai.Error {
	v := c.GetHeader(engineapi.PriorityHeader)
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return openai.InvalidRequest("", "header %s must be an integer, not %q", engineapi.PriorityHeader, openai.Echo(v))
	}
	p.Priority = n
	return nil
}

// kvTokens is the capacity of eng's KV pool in tokens.
func kvTokens(eng *core.Engine) int { return eng.Stats().KVBlocks * kvcache.BlockSize }

// chatPrompt renders messages with the model's chat template and encodes
// the result; the template writes the special tokens itself, so addSpecial
// is normally false.
func chatPrompt(l *Loaded, msgs []openai.ChatMessage, addGenerationPrompt, addSpecial bool) ([]int32, *openai.Error) {
	if l.Tokenizer == nil {
		return nil, openai.InvalidRequest("messages", "model %s has no tokenizer, so it cannot apply a chat template: use /v1/completions with token ids", l.Name)
	}
	text, err := l.Tokenizer.ApplyChatTemplate(chatMessages(msgs), addGenerationPrompt)
	if err != nil {
		if errors.Is(err, tokenizer.ErrTemplateException) {
			return nil, openai.InvalidRequest("messages", "messages rejected by the chat template: %v", err)
		}
		if errors.Is(err, tokenizer.ErrChatTemplateLimit) {
			// The template is the model's, but these messages made it run
			// past its bounds: fail the request, the engine is unaffected.
			return nil, openai.InvalidRequest("messages", "cannot apply the chat template of model %s: %v", l.Name, err)
		}
		return nil, openai.ServerError("apply chat template: %v", err)
	}
	return encodeText(l, text, addSpecial, "messages")
}

// encodeText encodes text with l's tokenizer; a regex of the tokenizer that
// runs past its match timeout on this input fails the request as invalid
// (naming param), not the server.
func encodeText(l *Loaded, text string, addSpecial bool, param string) ([]int32, *openai.Error) {
	ids, err := l.Tokenizer.EncodeChecked(text, addSpecial)
	if err != nil {
		if errors.Is(err, tokenizer.ErrRegexLimit) {
			return nil, openai.InvalidRequest(param, "cannot tokenize %s for model %s: %v", param, l.Name, err)
		}
		return nil, openai.ServerError("tokenize %s: %v", param, err)
	}
	return ids, nil
}

// generate submits a job and answers with a stream or a whole response.
// A client that goes away aborts the request so its KV blocks are freed.
func (s *Server) generate(c *gin.Context, j *job) {
	applyExtensions(c, &j.params)
	st, err := j.engine.Submit(j.params)
	if err != nil {
		writeError(c, submitError(err))
		return
	}
	finished := false
	defer func() {
		if !finished {
			j.engine.Abort(st.ID)
		}
	}()
	ctx := c.Request.Context()
	if !j.stream {
		var text strings.Builder
		var ids []int32
		var lps []sample.Logprobs
		for {
			d, ok := st.Next(ctx)
			if !ok {
				return
			}
			if d.PromptLogprobs != nil {
				j.format.scored(d.PromptLogprobs)
			}
			text.WriteString(d.Text)
			ids = append(ids, d.IDs...)
			lps = append(lps, d.Logprobs...)
			if d.Finish == "" {
				continue
			}
			finished = true
			if d.Finish != core.FinishStop && d.Finish != core.FinishLength {
				writeError(c, endError(d))
				return
			}
			if len(lps) != len(ids) {
				lps = nil
			}
			writeJSON(c, http.StatusOK, j.format.final(text.String(), ids, lps, d.Finish, usage(d.Usage)))
			return
		}
	}

	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Trailer", engineapi.UsageTrailer)
	c.Writer.WriteHeader(http.StatusOK)
	sse := &sseWriter{c: c}
	if first := j.format.first(); first != nil && !sse.event(first) {
		return
	}
	sse.flush()
	for {
		d, ok := st.Next(ctx)
		if !ok {
			return
		}
		if d.PromptLogprobs != nil {
			j.format.scored(d.PromptLogprobs)
		}
		lps := d.Logprobs
		if len(lps) != len(d.IDs) {
			lps = nil
		}
		if d.Finish == "" {
			if d.Text == "" && lps == nil && !j.format.held() {
				continue // held back by the detokenizer or a possible stop string
			}
			if !sse.event(j.format.chunk(d.Text, d.IDs, lps, nil)) {
				return
			}
			continue
		}
		finished = true
		if d.Finish == core.FinishStop || d.Finish == core.FinishLength {
			reason := d.Finish
			sse.event(j.format.chunk(d.Text, d.IDs, lps, &reason))
			if j.includeUsage {
				sse.event(j.format.usage(usage(d.Usage)))
			}
		} else {
			if d.Text != "" || lps != nil {
				sse.event(j.format.chunk(d.Text, d.IDs, lps, nil))
			}
			sse.event(endError(d).Body())
		}
		sse.done()
		if u, err := json.Marshal(usage(d.Usage)); err == nil {
			h.Set(engineapi.UsageTrailer, string(u))
		}
		return
	}
}

// endError explains a request that ended without stop or length.
func endError(d core.Delta) *openai.Error {
	if errors.Is(d.Err, core.ErrDraining) {
		return openai.Unavailable("the engine stopped before the request finished")
	}
	if d.Err != nil {
		return openai.ServerError("generation failed: %v", d.Err)
	}
	return openai.ServerError("generation ended early (%s)", d.Finish)
}

func usage(u core.Usage) *openai.Usage {
	return openai.NewUsage(u.PromptTokens, u.CompletionTokens, u.CachedTokens)
}

// sseWriter writes server-sent events, flushing each; after a failed
// write it writes nothing more.
type sseWriter struct {
	c      *gin.Context
	failed bool
	buf    bytes.Buffer
}

func (w *sseWriter) event(v any) bool {
	w.buf.Reset()
	w.buf.WriteString("data: ")
	enc := json.NewEncoder(&w.buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		w.failed = true
		return false
	}
	w.buf.Truncate(w.buf.Len() - 1) // Encode's newline
	w.buf.WriteString("\n\n")
	return w.write(w.buf.Bytes())
}

func (w *sseWriter) done() bool { return w.write([]byte("data: [DONE]\n\n")) }

func (w *sseWriter) write(b []byte) bool {
	if w.failed {
		return false
	}
	if _, err := w.c.Writer.Write(b); err != nil {
		w.failed = true
		return false
	}
	w.flush()
	return true
}

func (w *sseWriter) flush() { w.c.Writer.Flush() }

// completionFormat shapes /v1/completions output.
type completionFormat struct {
	head
	offset int // text_offset of the next generated token
	// echo is the prompt the choice's text starts with; nil without echo.
	echo *echoed
}

// echoed is the prompt an echo completion's text starts with, and its
// tokens for the logprobs.
type echoed struct {
	text string
	ids  []int32
	// offsets are the prompt tokens' text_offset: where the text decoded
	// from the tokens before each one ends, within text.
	offsets []int
	// end is where the generated text starts, in text_offset terms.
	end int
	// lps score the prompt tokens after the first, once the engine sent
	// them; ready is set when the prompt can go out (with its logprobs
	// when they are asked for), sent once it has.
	lps   []sample.Logprobs
	ready bool
	sent  bool
}

// newEchoed prepares the echo of prompt ids whose text is text (the
// client's text, or the ids decoded). Each token's text_offset is the
// length of the text the tokens before it decode to (as the generated
// text is decoded, skipSpecial alike), within text; without a tokenizer
// the offsets add up the tokens' "token_id:N" names, as the generated
// tokens' do.
func newEchoed(h *head, text string, ids []int32, skipSpecial bool) *echoed {
	e := &echoed{text: text, ids: ids, offsets: make([]int, len(ids)), ready: h.logprobs < 0}
	if h.tok == nil {
		for i, id := range ids {
			e.offsets[i] = e.end
			name, _ := h.token(id)
			e.end += len(name)
		}
		return e
	}
	d := h.tok.NewStreamDecoder(skipSpecial)
	decoded := 0
	for i, id := range ids {
		e.offsets[i] = min(decoded, len(text))
		decoded += len(d.Add(id))
	}
	e.end = len(text)
	return e
}

func (f *completionFormat) response(choices []openai.CompletionChoice, u *openai.Usage) *openai.CompletionResponse {
	return &openai.CompletionResponse{ID: f.id, Object: openai.ObjectTextCompletion, Created: f.created, Model: f.model, Choices: choices, Usage: u}
}

// first is the echoed prompt when nothing more is needed for it (no
// logprobs asked for): OpenAI streams it first.
func (f *completionFormat) first() any {
	if !f.held() {
		return nil
	}
	return f.chunk("", nil, nil, nil)
}

func (f *completionFormat) scored(lps []sample.Logprobs) {
	if f.echo != nil {
		f.echo.lps, f.echo.ready = lps, true
	}
}

// promptDone lets the echoed prompt go out with the answer's last chunk
// even if its logprobs never came (they would be null).
func (f *completionFormat) promptDone() {
	if f.echo != nil {
		f.echo.ready = true
	}
}

func (f *completionFormat) held() bool {
	return f.echo != nil && f.echo.ready && !f.echo.sent
}

func (f *completionFormat) chunk(text string, ids []int32, lps []sample.Logprobs, finish *string) any {
	if finish != nil {
		f.promptDone()
	}
	text, logprobs := f.withEcho(text, ids, lps)
	return f.response([]openai.CompletionChoice{{Text: text, Logprobs: logprobs, FinishReason: finish}}, nil)
}

func (f *completionFormat) usage(u *openai.Usage) any {
	return f.response([]openai.CompletionChoice{}, u)
}

func (f *completionFormat) final(text string, ids []int32, lps []sample.Logprobs, finish string, u *openai.Usage) any {
	f.promptDone()
	text, logprobs := f.withEcho(text, ids, lps)
	return f.response([]openai.CompletionChoice{{Text: text, Logprobs: logprobs, FinishReason: &finish}}, u)
}

// withEcho is the text and logprobs of generated output, the echoed
// prompt's first when it is held.
func (f *completionFormat) withEcho(text string, ids []int32, lps []sample.Logprobs) (string, *openai.CompletionLogprobs) {
	generated := f.logprobs(ids, lps)
	if !f.held() {
		return text, generated
	}
	e := f.echo
	e.sent = true
	if f.head.logprobs < 0 {
		return e.text + text, generated
	}
	out := f.promptLogprobs()
	if generated != nil {
		out.Tokens = append(out.Tokens, generated.Tokens...)
		out.TokenLogprobs = append(out.TokenLogprobs, generated.TokenLogprobs...)
		out.TopLogprobs = append(out.TopLogprobs, generated.TopLogprobs...)
		out.TextOffset = append(out.TextOffset, generated.TextOffset...)
	}
	return e.text + text, out
}

// newCompletionLogprobs is an empty logprobs object (arrays, not nulls).
func newCompletionLogprobs() *openai.CompletionLogprobs {
	return &openai.CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []*float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
}

// entry is one token's logprob and top_logprobs: the alternatives and the
// token itself, as OpenAI lists it there.
func (f *completionFormat) entry(tok string, lp sample.Logprobs) (*float64, map[string]float64) {
	top := map[string]float64{}
	for _, alt := range lp.Top {
		at, _ := f.token(alt.ID)
		top[at] = float64(alt.Logprob)
	}
	chosen := float64(lp.Chosen.Logprob)
	top[tok] = chosen
	return &chosen, top
}

// logprobs is the generated tokens' logprobs object; nil unless asked for.
func (f *completionFormat) logprobs(ids []int32, lps []sample.Logprobs) *openai.CompletionLogprobs {
	if f.head.logprobs < 0 || lps == nil {
		return nil
	}
	out := newCompletionLogprobs()
	for _, lp := range lps {
		tok, raw := f.token(lp.Chosen.ID)
		chosen, top := f.entry(tok, lp)
		out.Tokens = append(out.Tokens, tok)
		out.TokenLogprobs = append(out.TokenLogprobs, chosen)
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, f.offset)
		if raw != nil {
			f.offset += len(raw) // the bytes the token adds to the text
		} else {
			f.offset += len(tok)
		}
	}
	return out
}

// promptLogprobs is the echoed prompt's part of the logprobs object: its
// first token, with no position before it, has null logprobs (as a token
// the engine did not score would).
func (f *completionFormat) promptLogprobs() *openai.CompletionLogprobs {
	e := f.echo
	out := newCompletionLogprobs()
	for i, id := range e.ids {
		tok, _ := f.token(id)
		out.Tokens = append(out.Tokens, tok)
		out.TextOffset = append(out.TextOffset, e.offsets[i])
		if i == 0 || i > len(e.lps) {
			out.TokenLogprobs = append(out.TokenLogprobs, nil)
			out.TopLogprobs = append(out.TopLogprobs, nil)
			continue
		}
		chosen, top := f.entry(tok, e.lps[i-1])
		out.TokenLogprobs = append(out.TokenLogprobs, chosen)
		out.TopLogprobs = append(out.TopLogprobs, top)
	}
	return out
}

// chatFormat shapes /v1/chat/completions output.
type chatFormat struct {
	head
}

func (f *chatFormat) chunkOf(choices []openai.ChatChunkChoice, u *openai.Usage) *openai.ChatCompletionChunk {
	return &openai.ChatCompletionChunk{ID: f.id, Object: openai.ObjectChatChunk, Created: f.created, Model: f.model, Choices: choices, Usage: u}
}

func (f *chatFormat) first() any {
	empty := ""
	return f.chunkOf([]openai.ChatChunkChoice{{Delta: openai.ChatDelta{Role: "assistant", Content: &empty}}}, nil)
}

// scored ignores prompt logprobs: chat completions do not echo.
func (f *chatFormat) scored([]sample.Logprobs) {}

// held is false: a chat format holds nothing back.
func (f *chatFormat) held() bool { return false }

func (f *chatFormat) chunk(text string, ids []int32, lps []sample.Logprobs, finish *string) any {
	var delta openai.ChatDelta
	if text != "" || finish == nil {
		delta.Content = &text
	}
	return f.chunkOf([]openai.ChatChunkChoice{{Delta: delta, Logprobs: f.logprobs(lps), FinishReason: finish}}, nil)
}

func (f *chatFormat) usage(u *openai.Usage) any {
	return f.chunkOf([]openai.ChatChunkChoice{}, u)
}

func (f *chatFormat) final(text string, ids []int32, lps []sample.Logprobs, finish string, u *openai.Usage) any {
	return &openai.ChatCompletionResponse{ID: f.id, Object: openai.ObjectChatCompletion, Created: f.created, Model: f.model,
		Choices: []openai.ChatChoice{{Message: openai.ResponseMessage{Role: "assistant", Content: text}, Logprobs: f.logprobs(lps), FinishReason: finish}},
		Usage:   u}
}

// logprobs is the chat logprobs object; nil unless asked for.
func (f *chatFormat) logprobs(lps []sample.Logprobs) *openai.ChatLogprobs {
	if f.head.logprobs < 0 || lps == nil {
		return nil
	}
	out := &openai.ChatLogprobs{Content: make([]openai.TokenLogprob, 0, len(lps))}
	for _, lp := range lps {
		tok, raw := f.token(lp.Chosen.ID)
		entry := openai.TokenLogprob{Token: tok, Logprob: float64(lp.Chosen.Logprob), Bytes: byteList(raw), TopLogprobs: []openai.TopLogprob{}}
		for _, alt := range lp.Top {
			at, araw := f.token(alt.ID)
			entry.TopLogprobs = append(entry.TopLogprobs, openai.TopLogprob{Token: at, Logprob: float64(alt.Logprob), Bytes: byteList(araw)})
		}
		out.Content = append(out.Content, entry)
	}
	return out
}

// byteList is the JSON "bytes" of a token: nil (null) when unknown.
func byteList(raw []byte) []int {
	if raw == nil {
		return nil
	}
	b := make([]int, len(raw))
	for i, c := range raw {
		b[i] = int(c)
	}
	return b
}

func (s *Server) tokenize(c *gin.Context) {
	var req openai.TokenizeRequest
	l, _, ok := s.admit(c, &req, &req.Model)
	if !ok {
		return
	}
	defer s.release()
	if l.Tokenizer == nil {
		writeError(c, openai.InvalidRequest("prompt", "model %s has no tokenizer", l.Name))
		return
	}
	var ids []int32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(c, openai.InvalidRequest("messages", "give either prompt or messages, not both"))
		return
	case req.Prompt != nil:
		var e *openai.Error
		if ids, e = encodeText(l, *req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens, "prompt"); e != nil {
			writeError(c, e)
			return
		}
	case req.Messages != nil:
		if e := openai.CheckMessages(req.Messages); e != nil {
			writeError(c, e)
			return
		}
		p, e := chatPrompt(l, req.Messages, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
			req.AddSpecialTokens != nil && *req.AddSpecialTokens)
		if e != nil {
			writeError(c, e)
			return
		}
		ids = p
	default:
		writeError(c, openai.InvalidRequest("prompt", "prompt or messages is required"))
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	writeJSON(c, http.StatusOK, openai.TokenizeResponse{Tokens: ids, Count: len(ids), MaxModelLen: l.MaxModelLen})
}

func chatMessages(msgs []openai.ChatMessage) []tokenizer.Message {
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content.Text}
	}
	return tm
}

func (s *Server) detokenize(c *gin.Context) {
	var req openai.DetokenizeRequest
	l, _, ok := s.admit(c, &req, &req.Model)
	if !ok {
		return
	}
	defer s.release()
	if l.Tokenizer == nil {
		writeError(c, openai.InvalidRequest("tokens", "model %s has no tokenizer", l.Name))
		return
	}
	if e := checkTokens(req.Tokens, l.vocabSize(), "tokens"); e != nil {
		writeError(c, e)
		return
	}
	writeJSON(c, http.StatusOK, openai.DetokenizeResponse{Prompt: l.Tokenizer.Decode(req.Tokens, false)})
}
