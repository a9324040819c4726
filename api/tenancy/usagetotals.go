package tenancy

import (
	"context"

	"github.com/stokehq/stoke/internal/store"
)

// UsageTotals sums the usage records q selects by tenant, model and UTC
// day (see store.Store.UsageTotals): what /admin/usage and /v1/usage
// answer.
func (s *Service) UsageTotals(ctx context.Context, q store.UsageQuery) ([]store.UsageTotal, error) {
	return s.o.Store.UsageTotals(ctx, q)
}
