package server

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/stokehq/stoke/engine/core"
	"github.com/stokehq/stoke/engine/engineapi"
)

func TestHeaderPriorityOverridesTheBody(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   int
		bad    bool
	}{
		{"", 7, false}, // no header: the body's stays
		{"-1000", -1000, false},
		{"100", 100, false},
		{"high", 0, true},
	} {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
		if tc.header != "" {
			c.Request.Header.Set(engineapi.PriorityHeader, tc.header)
		}
		p := core.Params{Priority: 7}
		e := headerPriority(c, &p)
		if (e != nil) != tc.bad || (!tc.bad && p.Priority != tc.want) {
			t.Errorf("header %q: priority %d, error %v; want %d, error %v", tc.header, p.Priority, e, tc.want, tc.bad)
		}
	}
}
