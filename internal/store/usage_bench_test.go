package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkUsageRecord measures what recording one request's usage costs
// on its path (an append to the journal) and what moving it into the table
// costs off the path (a direct insert: the drain's work, per batch size).
func BenchmarkUsageRecord(b *testing.B) {
	rec := func(i int) UsageRecord {
		return UsageRecord{RequestID: fmt.Sprint("req-", i), TenantID: "t", KeyID: "k", Model: "chat", Status: 200,
			PromptTokens: 10, CompletionTokens: 1, TTFT: time.Millisecond, Duration: time.Millisecond, CreatedAt: time.Now()}
	}
	for _, bk := range backends() {
		b.Run(bk.name, func(b *testing.B) { benchmarkUsageRecord(b, bk, rec) })
	}
}

func benchmarkUsageRecord(b *testing.B, bk backend, rec func(int) UsageRecord) {
	// open opens a fresh store outside the measured time (a PostgreSQL
	// database takes a while to create).
	open := func(b *testing.B) *Store {
		st := bk.open(b)
		b.ResetTimer()
		return st
	}
	b.Run("append", func(b *testing.B) {
		st := open(b)
		for i := range b.N {
			if err := st.AppendUsage([]UsageRecord{rec(i)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{1, 200} {
		b.Run(fmt.Sprintf("insert-%d", n), func(b *testing.B) {
			st := open(b)
			batch := make([]UsageRecord, n)
			for i := range b.N {
				for j := range batch {
					batch[j] = rec(i*n + j)
				}
				if err := st.InsertUsage(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
