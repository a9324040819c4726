package runtime

import (
	"slices"
	"testing"
)

func TestPlanSlots(t *testing.T) {
	for _, tc := range []struct {
		name         string
		count        int
		budget, slot int64
		spot         int
		want         []Class
		wantErr      bool
	}{
		{name: "by count", count: 3, spot: 1, want: []Class{OnDemand, OnDemand, Spot}},
		{name: "by memory", budget: 10 << 30, slot: 4 << 30, want: []Class{OnDemand, OnDemand}},
		{name: "count wins", count: 1, budget: 10 << 30, slot: 1 << 30, spot: 1, want: []Class{Spot}},
		{name: "nothing fits", budget: 1 << 30, slot: 4 << 30, wantErr: true},
		{name: "too many spot", count: 2, spot: 3, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PlanSlots(tc.count, tc.budget, tc.slot, tc.spot)
			if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
				t.Fatalf("PlanSlots = %v, %v; want %v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
