package push

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vbauerster/mpb/v8"

	"github.com/stokehq/stoke/weightstore/manifest"
)

func TestBarProgress(t *testing.T) {
	files := []manifest.File{{Name: "a.safetensors", Size: 1000}, {Name: "b.safetensors", Size: 10}, {Name: "empty", Size: 0}}
	tests := []struct {
		name string
		fail bool
		want string
	}{
		{"success", false, "total (3 files, 1 present)"},
		{"failure", true, "total (3 files, 1 present)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			p := newBarProgress(context.Background(), &out, len(files), 1, 1010, mpb.WithAutoRefresh())
			for i, f := range files {
				tr := p.start(f)
				tr.add(f.Size / 2)
				tr.add(f.Size) // a retried part: counted once, capped at the size
				var err error
				if tc.fail && i == 1 {
					err = errors.New("boom")
				}
				tr.done(err)
			}
			p.wait(!tc.fail) // returns: every bar is complete or aborted
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out.String())
			}
			if got := p.total.Current(); got != 1010 {
				t.Errorf("total bar at %d bytes, want 1010", got)
			}
		})
	}
}
