package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newDeploymentCmd() *cobra.Command {
	c := &adminClient{}
	cmd := &cobra.Command{
		Use:   "deployment",
		Short: "List and show the deployments of stoke serve, and drive their rollouts",
		Long: `Deployment drives /admin/deployments of a running stoke serve: list and show
deployments (the revision each serves, its effective spec, its latest
rollout), list a deployment's rollouts, promote or roll back its canary by
hand, and pin it to a revision (a push is then recorded but not deployed
until it is unpinned).
Every request carries the admin key as its bearer token: the first line of
--admin-key-file, else --admin-key, else $STOKE_ADMIN_KEY.`,
	}
	c.addFlags(cmd.PersistentFlags())
	show := func(use, short, long, method, suffix string, args int, body func(args []string) any) *cobra.Command {
		return &cobra.Command{
			Use: use, Short: short, Long: long, Args: cobra.ExactArgs(args),
			RunE: oneLine(func(cmd *cobra.Command, args []string) error {
				var in any
				if body != nil {
					in = body(args)
				}
				raw, err := c.do(cmd.Context(), method, "/admin/deployments/"+url.PathEscape(args[0])+suffix, in, nil)
				if err != nil {
					return fmt.Errorf("deployment %s %s: %w", strings.Fields(use)[0], args[0], err)
				}
				return printIndented(cmd.OutOrStdout(), raw)
			}),
		}
	}
	cmd.AddCommand(newDeploymentListCmd(c),
		show("get NAME", "Show a deployment", `Get prints the deployment NAME as the server holds it (JSON, indented): the
revision it serves, whether it is pinned, its spec and effective spec, its
live status, and its latest rollout with the eval gate's figures.`, http.MethodGet, "", 1, nil),
		show("rollouts NAME", "List a deployment's rollouts, newest first", `Rollouts prints the rollouts of NAME (JSON, indented): each candidate
revision against the stable one, its canary share, how it ended and why.`, http.MethodGet, "/rollouts", 1, nil),
		show("promote NAME", "Promote a deployment's canary now", `Promote ends the canary of NAME by serving its candidate revision, whatever
its eval gate would say; the stable replicas are replaced as the candidate's
take over.`, http.MethodPost, "/promote", 1, nil),
		show("rollback NAME", "Roll a deployment's canary back", `Rollback ends the canary of NAME: every request goes back to the stable
revision and the candidate's replicas are released. The candidate stays a
ready revision (pin it to serve it after all).`, http.MethodPost, "/rollback", 1, nil),
		show("pin NAME REVISION", "Serve one revision, whatever is pushed next", `Pin makes NAME serve REVISION (a digest, sha256:…, of a ready or rejected
revision of its model) and keeps it there: a later push is recorded but not
deployed until unpin. A canary in progress ends.`, http.MethodPost, "/pin", 2,
			func(args []string) any { return map[string]string{"revision": args[1]} }),
		show("unpin NAME", "Follow pushes again", `Unpin lets the next push of NAME's model deploy again (through its rollout
gate, if any); what NAME serves now does not change.`, http.MethodPost, "/unpin", 1, nil),
	)
	return cmd
}

// printIndented writes a JSON answer indented, on its own lines.
func printIndented(w io.Writer, raw []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return fmt.Errorf("the server's answer is not JSON: %w", err)
	}
	b.WriteByte('\n')
	_, err := b.WriteTo(w)
	return err
}

func newDeploymentListCmd(c *adminClient) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the deployments",
		Long: `List prints every deployment: name, the revision it serves (short), whether
it is pinned, its ready replicas, and its latest rollout's state and
candidate; or the server's JSON list with --json.`,
		Args: cobra.NoArgs,
		RunE: oneLine(func(cmd *cobra.Command, args []string) error {
			var list struct {
				Data []struct {
					Name     string `json:"name"`
					Revision string `json:"revision"`
					Pinned   bool   `json:"pinned"`
					Status   *struct {
						Ready int `json:"ready"`
					} `json:"status"`
					Rollout *struct {
						State     string `json:"state"`
						Candidate string `json:"candidate"`
					} `json:"rollout"`
				} `json:"data"`
			}
			raw, err := c.do(cmd.Context(), http.MethodGet, "/admin/deployments", nil, &list)
			if err != nil {
				return fmt.Errorf("deployment list: %w", err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), raw)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tREVISION\tPINNED\tREADY\tROLLOUT")
			for _, d := range list.Data {
				ready, rollout := "-", "-"
				if d.Status != nil {
					ready = fmt.Sprint(d.Status.Ready)
				}
				if d.Rollout != nil {
					rollout = d.Rollout.State + " " + shortDigest(d.Rollout.Candidate)
				}
				fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", d.Name, shortDigest(d.Revision), d.Pinned, ready, rollout)
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the server's JSON list")
	return cmd
}

// shortDigest is a revision digest cut to its first 12 hex digits, as
// people read them.
func shortDigest(d string) string {
	if h, ok := strings.CutPrefix(d, "sha256:"); ok && len(h) > 12 {
		return "sha256:" + h[:12]
	}
	return d
}
