package tokenizer

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

func chatTok(t *testing.T, tpl string) *Tokenizer {
	t.Helper()
	return newSP(t, spOptions{}, string(mustJSON(t, map[string]any{"chat_template": tpl})))
}

// renderLimited applies tpl and checks it fails with ErrChatTemplateLimit
// within the time limit, without growing the process by much.
func renderLimited(t *testing.T, tpl string) error {
	t.Helper()
	tk := chatTok(t, tpl)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := tk.ApplyChatTemplate([]Message{{"user", "hi"}}, true)
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrChatTemplateLimit) {
		t.Fatalf("err = %v, want ErrChatTemplateLimit", err)
	}
	if took > ChatTemplateTimeout+chatTemplateGrace+500*time.Millisecond {
		t.Errorf("took %v, want about %v at most", took, ChatTemplateTimeout)
	}
	// What the process took from the OS, not the bytes allocated: a
	// render stopped by its deadline allocates what the CPU manages in
	// that time (350–700 MB of short-lived garbage here), while a template
	// that made the engine hold memory (range(1e9) grew it past 2.8 GB)
	// shows here.
	if grew := int64(after.Sys) - int64(before.Sys); grew > 256<<20 {
		t.Errorf("the process grew by %d MB", grew>>20)
	}
	return err
}

func TestChatTemplateLimits(t *testing.T) {
	t.Run("huge range", func(t *testing.T) {
		renderLimited(t, `{% for i in range(1000000000) %}x{% endfor %}`)
	})
	t.Run("huge output", func(t *testing.T) {
		// 100 MB: 1000 writes of 100 KB.
		err := renderLimited(t, `{% set s = "`+strings.Repeat("x", 100000)+`" %}{% for i in range(1000) %}{{ s }}{% endfor %}`)
		if !strings.Contains(err.Error(), "output") {
			t.Errorf("err = %v, want the output limit", err)
		}
	})
	t.Run("nested loops", func(t *testing.T) {
		renderLimited(t, `{% for i in range(10) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}`)
	})
	t.Run("nested loops filtered", func(t *testing.T) {
		renderLimited(t, `{% for i in range(100000) %}{% for j in range(100000) if j < 0 %}x{% endfor %}{% endfor %}`)
	})
	t.Run("macro recursion", func(t *testing.T) {
		renderLimited(t, `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`)
	})
	t.Run("ordinary template renders", func(t *testing.T) {
		tk := chatTok(t, `{% for m in messages %}{% for i in range(3) %}{{ m.content }}{% endfor %}{% endfor %}{{ range(5)|length }}{{ range(10, 0, -3)|join(",") }}`)
		got, err := tk.ApplyChatTemplate([]Message{{"user", "a"}, {"assistant", "b"}}, false)
		if err != nil || got != "aaabbb510,7,4,1" {
			t.Fatalf("got %q, %v", got, err)
		}
	})
}

func TestValidateChatTemplate(t *testing.T) {
	if err := ValidateChatTemplate(`{% for m in messages %}{{ m.content }}{% endfor %}`); err != nil {
		t.Errorf("valid template: %v", err)
	}
	for _, bad := range []string{`{% for m in messages %}{{ m.content }`, `{% include "/chat_template.jinja" %}`} {
		if err := ValidateChatTemplate(bad); err == nil {
			t.Errorf("ValidateChatTemplate(%q) = nil, want an error", bad)
		}
	}
	if _, err := New(spJSON(t, spOptions{}), []byte(`{"chat_template": "{% for m in messages %}{{ m.content }"}`)); err == nil {
		t.Errorf("New with a broken chat template succeeded")
	}
}

func TestRegexTimeout(t *testing.T) {
	tj := string(spJSON(t, spOptions{}))
	// Put a catastrophically backtracking Split pre-tokenizer in front.
	i := strings.Index(tj, `"pre_tokenizer":`)
	if i < 0 {
		t.Skip("fixture has no pre_tokenizer field")
	}
	tj = tj[:i] + `"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": false}, "ignored_pre_tokenizer":` + tj[i+len(`"pre_tokenizer":`):]
	tk, err := New([]byte(tj), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	start := time.Now()
	_, err = tk.EncodeChecked(strings.Repeat("a", 5000)+"b", false)
	took := time.Since(start)
	if !errors.Is(err, ErrRegexLimit) {
		t.Fatalf("err = %v, want ErrRegexLimit", err)
	}
	if took > RegexMatchTimeout+time.Second {
		t.Errorf("took %v", took)
	}
	if ids, err := tk.EncodeChecked("hello", false); err != nil || len(ids) == 0 {
		t.Errorf("ordinary input: %v, %v", ids, err)
	}
}
