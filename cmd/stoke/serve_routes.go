package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/stokehq/stoke/activator"
	"github.com/stokehq/stoke/internal/config"
	"github.com/stokehq/stoke/internal/store"
)

// newRouteBook puts the routes of --routes (when given) and those stored
// through /admin/routes in effect on act.
func newRouteBook(ctx context.Context, path string, act *activator.Activator, st *store.Store) (*activator.RouteBook, error) {
	var file config.Routes
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("--routes: %w", err)
		}
		if file, err = config.ParseRoutesYAML(raw); err != nil {
			return nil, fmt.Errorf("--routes %s: %w", path, err)
		}
	}
	book, err := activator.NewRouteBook(ctx, act, st, file, slog.Default())
	if err != nil {
		return nil, fmt.Errorf("--routes %s: %w", path, err)
	}
	return book, nil
}
