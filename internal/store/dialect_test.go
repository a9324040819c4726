package store

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestRebind(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"no placeholders", "SELECT 1", "SELECT 1"},
		{"in order", "UPDATE t SET a = ? WHERE b = ? AND c = ?", "UPDATE t SET a = $1 WHERE b = $2 AND c = $3"},
		{"past nine", strings.Repeat("?,", 11) + "?", "$1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12"},
		{"string literal", "x = '?' AND y = ?", "x = '?' AND y = $1"},
		{"escaped quote in a literal", "x = 'it''s ?' AND y = ?", "x = 'it''s ?' AND y = $1"},
		{"quoted identifier", `"odd?name" = ?`, `"odd?name" = $1`},
		{"line comment", "-- which one?\nx = ?", "-- which one?\nx = $1"},
		{"block comment", "/* ? */ x = ?", "/* ? */ x = $1"},
		{"unterminated literal", "x = ? AND y = 'abc ?", "x = $1 AND y = 'abc ?"},
		{"unterminated comment", "x = ? /* ?", "x = $1 /* ?"},
		{"comment at the end", "x = ? -- ?", "x = $1 -- ?"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := rebind(c.in); got != c.want {
				t.Errorf("rebind(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
	}{
		{"user info", "postgres://u:hunter2@db:5432/stoke?sslmode=disable", "postgres://u:xxxxx@db:5432/stoke?sslmode=disable"},
		{"no password", "postgres://u@db/stoke", "postgres://u@db/stoke"},
		{"query parameter", "postgresql://u@db/stoke?password=hunter2&sslmode=require", "postgresql://u@db/stoke?password=xxxxx&sslmode=require"},
		{"escaped", "postgres://u:hunt%40er2@db/stoke", "postgres://u:xxxxx@db/stoke"},
		{"does not parse", "postgres://u:hunter2@db:port/stoke", "(a URL that does not parse)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := redactURL(c.in); got != c.want {
				t.Errorf("redactURL(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestRedactErr(t *testing.T) {
	base := errors.New("base")
	for _, c := range []struct {
		name, url, msg string
		gone           []string
	}{
		{"decoded and escaped", "postgres://u:p%40ss@db/x", "dial postgres://u:p%40ss@db/x: password p@ss refused", []string{"p@ss", "p%40ss"}},
		{"query", "postgres://u@db/x?password=a+b", "password=a+b and a b", []string{"a b", "a+b"}},
		{"none", "postgres://u@db/x", "nothing to hide", nil},
		{"a URL that does not parse", "postgres://u:s3%2Fcret@db:port/x", "bad URL postgres://u:s3%2Fcret@db:port/x (s3/cret)", []string{"s3%2Fcret", "s3/cret"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := redactErr(fmt.Errorf("%s: %w", c.msg, base), secrets(c.url))
			for _, g := range c.gone {
				if strings.Contains(err.Error(), g) {
					t.Errorf("%q shows %q", err, g)
				}
			}
			if !errors.Is(err, base) {
				t.Errorf("%v no longer wraps its cause", err)
			}
		})
	}
	if redactErr(nil, []string{"x"}) != nil {
		t.Error("redactErr(nil) is not nil")
	}
}

// TestIsUniqueViolation: the helper matches each driver's error for a
// duplicate key, and not other errors (nor text that merely looks like
// one).
func TestIsUniqueViolation(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		s := bk.open(t)
		ctx := t.Context()
		if _, err := s.db.ExecContext(ctx, "CREATE TABLE u (k TEXT PRIMARY KEY, v TEXT UNIQUE, n INTEGER NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.db.ExecContext(ctx, "INSERT INTO u (k, v, n) VALUES ('a', 'x', 1)"); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name, stmt string
			want       bool
		}{
			{"primary key", "INSERT INTO u (k, v, n) VALUES ('a', 'y', 1)", true},
			{"unique column", "INSERT INTO u (k, v, n) VALUES ('b', 'x', 1)", true},
			{"not null", "INSERT INTO u (k, v, n) VALUES ('c', 'z', NULL)", false},
			{"syntax", "INSERT INTO nowhere VALUES (1)", false},
		} {
			t.Run(c.name, func(t *testing.T) {
				_, err := s.db.ExecContext(ctx, c.stmt)
				if err == nil {
					t.Fatalf("%s succeeded", c.stmt)
				}
				if got := isUniqueViolation(fmt.Errorf("wrapped: %w", err)); got != c.want {
					t.Errorf("isUniqueViolation(%v) = %v, want %v", err, got, c.want)
				}
			})
		}
	})
	if isUniqueViolation(errors.New("UNIQUE constraint failed: x")) {
		t.Error("text alone counts as a unique violation")
	}
}
