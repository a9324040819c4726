package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestBatchStatusTable(t *testing.T) {
	for _, tc := range []struct {
		from, to BatchStatus
		ok       bool
	}{
		{BatchValidating, BatchInProgress, true},
		{BatchValidating, BatchFailed, true},
		{BatchValidating, BatchCancelling, true},
		{BatchInProgress, BatchFinalizing, true},
		{BatchInProgress, BatchExpired, true},
		{BatchInProgress, BatchCancelling, true},
		{BatchFinalizing, BatchCompleted, true},
		{BatchCancelling, BatchCancelled, true},
		{BatchValidating, BatchCompleted, false},
		{BatchFinalizing, BatchCancelling, false},
		{BatchCompleted, BatchCancelling, false},
		{BatchCancelled, BatchInProgress, false},
		{BatchFailed, BatchInProgress, false},
	} {
		if got := tc.from.CanMoveTo(tc.to); got != tc.ok {
			t.Errorf("%s → %s allowed = %v, want %v", tc.from, tc.to, got, tc.ok)
		}
	}
	for _, s := range []BatchStatus{BatchCompleted, BatchFailed, BatchExpired, BatchCancelled} {
		if !s.Final() {
			t.Errorf("%s is not final", s)
		}
	}
}

func TestBatchLinesRecordedOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		b := Batch{ID: "batch_1", InputFileID: "file-1", Endpoint: "/v1/completions", CompletionWindow: "24h", CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour),
			Metadata: json.RawMessage(`{"k":"v"}`)}
		if err := s.CreateBatch(ctx, b); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateBatch(ctx, b); !errors.Is(err, ErrInvalid) {
			t.Errorf("CreateBatch of a recorded id: %v", err)
		}
		if _, err := s.RecordLines(ctx, b.ID, []LineResult{{Line: 1}}); !errors.Is(err, ErrIllegalTransition) {
			t.Errorf("RecordLines of a validating batch: %v", err)
		}
		if _, err := s.MoveBatch(ctx, b.ID, BatchFinalizing, BatchUpdate{}); !errors.Is(err, ErrIllegalTransition) {
			t.Errorf("validating → finalizing: %v", err)
		}
		dup := []BatchLine{{Line: 1, CustomID: "a", Body: json.RawMessage(`{}`)}, {Line: 2, CustomID: "a", Body: json.RawMessage(`{}`)}}
		if _, err := s.MoveBatch(ctx, b.ID, BatchInProgress, BatchUpdate{Lines: dup}); !errors.Is(err, ErrInvalid) {
			t.Errorf("start with a duplicate custom_id: %v", err)
		}
		if got, _ := s.Batch(ctx, b.ID); got.Status != BatchValidating || got.Total != 0 {
			t.Fatalf("a refused start changed the batch: %+v", got)
		}
		var lines []BatchLine
		for i := 1; i <= 5; i++ {
			lines = append(lines, BatchLine{Line: i, CustomID: fmt.Sprint("c", i), Body: json.RawMessage(`{"model":"m"}`)})
		}
		got, err := s.MoveBatch(ctx, b.ID, BatchInProgress, BatchUpdate{Lines: lines})
		if err != nil || got.Status != BatchInProgress || got.Total != 5 || got.At[BatchInProgress].IsZero() || string(got.Metadata) != `{"k":"v"}` {
			t.Fatalf("start: %+v, %v", got, err)
		}
		n, err := s.RecordLines(ctx, b.ID, []LineResult{{Line: 1, Result: json.RawMessage(`"one"`)}, {Line: 2, Failed: true, Result: json.RawMessage(`"two"`)}})
		if err != nil || n != 2 {
			t.Fatalf("record: %d, %v", n, err)
		}
		// A second result for a recorded line is skipped: the first stays.
		n, err = s.RecordLines(ctx, b.ID, []LineResult{{Line: 1, Failed: true, Result: json.RawMessage(`"again"`)}, {Line: 3, Result: json.RawMessage(`"three"`)}})
		if err != nil || n != 1 {
			t.Fatalf("record again: %d, %v", n, err)
		}
		got, _ = s.Batch(ctx, b.ID)
		if got.Completed != 2 || got.Failed != 1 {
			t.Fatalf("counts %d completed, %d failed; want 2, 1", got.Completed, got.Failed)
		}
		ok, err := s.BatchLines(ctx, b.ID, LineSucceeded, 0, 10)
		if err != nil || len(ok) != 2 || string(ok[0].Result) != `"one"` || ok[1].Line != 3 {
			t.Fatalf("succeeded lines %+v, %v", ok, err)
		}
		pending, _ := s.BatchLines(ctx, b.ID, LinePending, 0, 10)
		if len(pending) != 2 || pending[0].Line != 4 || string(pending[0].Body) != `{"model":"m"}` {
			t.Fatalf("pending lines %+v", pending)
		}
		page, _ := s.BatchLines(ctx, b.ID, LinePending, 4, 10)
		if len(page) != 1 || page[0].Line != 5 {
			t.Fatalf("pending after 4: %+v", page)
		}
		if _, err := s.MoveBatch(ctx, b.ID, BatchCancelling, BatchUpdate{}); err != nil {
			t.Fatal(err)
		}
		if n, err := s.RecordLines(ctx, b.ID, []LineResult{{Line: 4, Failed: true, Result: json.RawMessage(`"x"`)}}); err != nil || n != 1 {
			t.Fatalf("record while cancelling: %d, %v", n, err)
		}
		got, err = s.MoveBatch(ctx, b.ID, BatchCancelled, BatchUpdate{OutputFileID: "file-o", ErrorFileID: "file-e"})
		if err != nil || got.OutputFileID != "file-o" || got.ErrorFileID != "file-e" || got.At[BatchCancelled].IsZero() {
			t.Fatalf("cancelled: %+v, %v", got, err)
		}
		if _, err := s.RecordLines(ctx, b.ID, []LineResult{{Line: 5}}); !errors.Is(err, ErrIllegalTransition) {
			t.Errorf("RecordLines of a cancelled batch: %v", err)
		}
	})
}

func TestBatchesPages(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		for i := range 5 {
			b := Batch{ID: fmt.Sprint("batch_", i), InputFileID: "f", Endpoint: "/v1/completions", CompletionWindow: "24h",
				CreatedAt: now.Add(time.Duration(i) * time.Second), ExpiresAt: now.Add(time.Hour)}
			if err := s.CreateBatch(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		page, more, err := s.Batches(ctx, BatchQuery{Limit: 2})
		if err != nil || len(page) != 2 || !more || page[0].ID != "batch_4" || page[1].ID != "batch_3" {
			t.Fatalf("first page %v %v %v", page, more, err)
		}
		page, more, err = s.Batches(ctx, BatchQuery{After: "batch_3", Limit: 5})
		if err != nil || len(page) != 3 || more || page[0].ID != "batch_2" {
			t.Fatalf("after batch_3: %v %v %v", page, more, err)
		}
		if _, _, err := s.Batches(ctx, BatchQuery{After: "batch_x", Limit: 5}); !errors.Is(err, ErrNotFound) {
			t.Errorf("after an unknown batch: %v", err)
		}
		un, err := s.UnfinishedBatches(ctx)
		if err != nil || len(un) != 5 || un[0].ID != "batch_0" {
			t.Fatalf("unfinished %v %v", un, err)
		}
	})
}

// Batches are listed by owner, always ("" included), and another owner's
// batch as a cursor is as unknown as a missing one; UnfinishedBatches
// (the runner's) holds every owner's.
func TestBatchesByOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, bk backend) {
		ctx := context.Background()
		s := bk.open(t)
		now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		owners := []string{"tenant-a", "tenant-b", ""}
		for i := range 6 {
			b := Batch{ID: fmt.Sprint("batch_", i), Owner: owners[i%3], InputFileID: "f", Endpoint: "/v1/completions", CompletionWindow: "24h",
				CreatedAt: now.Add(time.Duration(i) * time.Second), ExpiresAt: now.Add(time.Hour)}
			if err := s.CreateBatch(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		if b, err := s.Batch(ctx, "batch_4"); err != nil || b.Owner != "tenant-b" {
			t.Errorf("Batch = %+v, %v; want owner tenant-b", b, err)
		}
		if b, err := s.MoveBatch(ctx, "batch_4", BatchCancelling, BatchUpdate{}); err != nil || b.Owner != "tenant-b" {
			t.Errorf("MoveBatch = %+v, %v; want owner tenant-b", b, err)
		}
		ids := func(bs []Batch) (out []string) {
			for _, b := range bs {
				out = append(out, b.ID+"/"+b.Owner)
			}
			return out
		}
		for _, c := range []struct {
			q    BatchQuery
			want []string
			more bool
		}{
			{BatchQuery{Owner: "tenant-a", Limit: 10}, []string{"batch_3/tenant-a", "batch_0/tenant-a"}, false},
			{BatchQuery{Owner: "tenant-b", Limit: 1}, []string{"batch_4/tenant-b"}, true},
			{BatchQuery{Owner: "tenant-b", Limit: 1, After: "batch_4"}, []string{"batch_1/tenant-b"}, false},
			{BatchQuery{Limit: 10}, []string{"batch_5/", "batch_2/"}, false},
			{BatchQuery{Owner: "tenant-c", Limit: 10}, nil, false},
		} {
			page, more, err := s.Batches(ctx, c.q)
			if err != nil || fmt.Sprint(ids(page)) != fmt.Sprint(c.want) || more != c.more {
				t.Errorf("Batches(%+v) = %v more=%v (%v), want %v more=%v", c.q, ids(page), more, err, c.want, c.more)
			}
		}
		for _, q := range []BatchQuery{
			{Owner: "tenant-b", Limit: 10, After: "batch_3"},
			{Limit: 10, After: "batch_3"},
			{Owner: "tenant-a", Limit: 10, After: "batch_5"},
		} {
			if page, _, err := s.Batches(ctx, q); !errors.Is(err, ErrNotFound) {
				t.Errorf("Batches(%+v) after another owner's batch = %v, %v; want ErrNotFound", q, ids(page), err)
			}
		}
		un, err := s.UnfinishedBatches(ctx)
		if err != nil || len(un) != 6 {
			t.Fatalf("unfinished %v %v; want all six", ids(un), err)
		}
		for i, b := range un {
			if b.Owner != owners[i%3] {
				t.Errorf("unfinished %s has owner %q, want %q", b.ID, b.Owner, owners[i%3])
			}
		}
	})
}
