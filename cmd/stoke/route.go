package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/stokehq/stoke/api"
	"github.com/stokehq/stoke/internal/config"
)

func newRouteCmd() *cobra.Command {
	c := &adminClient{}
	cmd := &cobra.Command{
		Use:   "route",
		Short: "List, show, set and delete the routes of stoke serve",
		Long: `Route drives /admin/routes of a running stoke serve. A route is a model
name clients send that resolves to deployments: by rules, else by a
weighted split, with fallbacks to deployments or providers. Routes the
routes file defines are read-only here (source "file"); the others were
set through the API (source "api").
Every request carries the admin key as its bearer token: the first line of
--admin-key-file, else --admin-key, else $STOKE_ADMIN_KEY.`,
	}
	c.addFlags(cmd.PersistentFlags())
	cmd.AddCommand(newRouteListCmd(c), newRouteGetCmd(c), newRouteSetCmd(c), newRouteDeleteCmd(c))
	return cmd
}

// routePath is the admin path of the route name; its slashes stay path
// separators, as the server takes names such as "org/name".
func routePath(name string) string {
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/admin/routes/" + strings.Join(segs, "/")
}

func newRouteListCmd(c *adminClient) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the routes",
		Long: `List prints the routes in effect: name, source (file or api), the default
split with each target's share, the number of rules and the fallbacks; or
the server's JSON list, providers included, with --json.`,
		Args: cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			var list api.RouteListJSON
			raw, err := c.do(cmd.Context(), http.MethodGet, "/admin/routes", nil, &list)
			if err != nil {
				return fmt.Errorf("route list: %w", err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			return routeTable(cmd.OutOrStdout(), list.Data)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's JSON list")
	return cmd
}

// routeTable writes routes as a table.
func routeTable(w io.Writer, routes []api.RouteJSON) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tDEFAULT\tRULES\tFALLBACKS")
	for _, r := range routes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", r.Name, orDash(r.Source), orDash(splitString(r.Split)), len(r.Rules), orDash(strings.Join(r.Fallbacks, ", ")))
	}
	return tw.Flush()
}

// splitString shows a split as its targets and shares, to one decimal at
// most: "a 90%, b 10%", "a 66.7%, b 33.3%".
func splitString(split []config.Weighted) string {
	total := 0
	for _, w := range split {
		total += w.Weight
	}
	parts := make([]string, 0, len(split))
	for _, w := range split {
		share := 0.0
		if total > 0 {
			share = math.Round(float64(w.Weight)*1000/float64(total)) / 10
		}
		parts = append(parts, w.To+" "+strconv.FormatFloat(share, 'f', -1, 64)+"%")
	}
	return strings.Join(parts, ", ")
}

func newRouteGetCmd(c *adminClient) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show a route",
		Long: `Get prints the route NAME as the server holds it (JSON, indented): its
rules, split, fallbacks and fallback_after, and its source (file or api).`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			raw, err := c.do(cmd.Context(), http.MethodGet, routePath(args[0]), nil, nil)
			if err != nil {
				return fmt.Errorf("route get %s: %w", args[0], err)
			}
			if err := printIndented(cmd.OutOrStdout(), raw); err != nil {
				return fmt.Errorf("route get %s: %w", args[0], err)
			}
			return nil
		}),
	}
}

func newRouteSetCmd(c *adminClient) *cobra.Command {
	var (
		file   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "set NAME --file FILE",
		Short: "Create or replace a route",
		Long: `Set puts the route NAME in effect, as FILE (YAML or JSON; - for standard
input) defines it: one route, such as

  rules:
    - match: {min_prompt_tokens: 4000}
      to: llama-70b
  split:
    - {to: llama-8b, weight: 90}
    - {to: llama-8b-canary, weight: 10}
  fallbacks: [llama-70b, openai]
  fallback_after: 2s

The file may leave out name; a name it gives must be NAME. The server
checks the route against the others, the deployments and the providers,
and refuses routes the routes file defines. Set prints NAME, or the
server's route object with --json.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if file == "" {
				return fmt.Errorf("route set %s: --file is required", name)
			}
			var raw []byte
			var err error
			if file == "-" {
				raw, err = io.ReadAll(cmd.InOrStdin())
			} else {
				raw, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("route set %s: read --file: %w", name, err)
			}
			body, err := routeFileJSON(raw)
			if err != nil {
				return fmt.Errorf("route set %s: %s: %w", name, file, err)
			}
			answer, err := c.do(cmd.Context(), http.MethodPut, routePath(name), body, nil)
			if err != nil {
				return fmt.Errorf("route set %s: %w", name, err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), answer)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), name)
			return err
		}),
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the route, YAML or JSON (`PATH`, or - for standard input; required)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's route object")
	return cmd
}

// routeFileJSON turns a route file (YAML, of which JSON is a kind) into
// the JSON object the server takes; the server checks its fields.
func routeFileJSON(raw []byte) (json.RawMessage, error) {
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, errors.New("the file is empty: want one route")
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, fmt.Errorf("want one route (a mapping), not %T", doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func newRouteDeleteCmd(c *adminClient) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a route set through the API",
		Long: `Delete takes the route NAME out of effect and prints NAME. Routes the
routes file defines are refused: edit the file instead.`,
		Args: cobra.ExactArgs(1),
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			if _, err := c.do(cmd.Context(), http.MethodDelete, routePath(args[0]), nil, nil); err != nil {
				return fmt.Errorf("route delete %s: %w", args[0], err)
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), args[0])
			return err
		}),
	}
}
