package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/images"
)

// defaultContainerdSocket is where a system containerd listens.
const defaultContainerdSocket = "/run/containerd/containerd.sock"

// defaultImagesNamespace is the containerd namespace images are imported
// into, the one the rest of stoke keeps its containerd objects in.
const defaultImagesNamespace = "stoke"

func newImagesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "images",
		Short: "Build OCI images of stoke and its engine runtime, without a Docker daemon",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newImagesBuildCmd())
	return cmd
}

type imagesBuildFlags struct {
	opts         images.Options
	doImport     bool
	socket       string
	namespace    string
	snapshotters []string
}

func newImagesBuildCmd() *cobra.Command {
	var f imagesBuildFlags
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Write the stoke and engine images as OCI image-layout archives",
		Long: `Build writes two images around one static stoke binary, each as an OCI
image-layout tar archive in --out:

  stoke   entrypoint /usr/local/bin/stoke, command: serve
  engine  entrypoint /usr/local/bin/stoke, command: engine --blank --listen unix:///run/stoke/engine.sock

Without --binary it compiles ./cmd/stoke in --source with CGO_ENABLED=0.
The same binary always gives the same digests. Load the archives with
'ctr images import', 'docker load' (Docker 25 or later), 'podman load' or
'skopeo copy oci-archive:...', or let --import put them into containerd and
unpack them for the containerd runtime backend.

It prints one line per image: reference, manifest digest, archive path.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runImagesBuild(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.opts.Out, "out", ".stoke/images", "directory to write the archives to")
	fl.StringVar(&f.opts.Binary, "binary", "", "static linux stoke binary to package (default: compile one from --source)")
	fl.StringVar(&f.opts.Source, "source", ".", "module directory to compile stoke in when --binary is not given")
	fl.StringVar(&f.opts.Arch, "arch", images.DefaultArch, "GOARCH to compile for when --binary is not given")
	fl.StringVar(&f.opts.Repository, "repository", images.DefaultRepository, "repository prefix of the images' names")
	fl.StringVar(&f.opts.Tag, "tag", images.DefaultTag, "tag of the images")
	fl.BoolVar(&f.doImport, "import", false, "also import the images into containerd and unpack them")
	fl.StringVar(&f.socket, "containerd-socket", defaultContainerdSocket, "containerd socket for --import")
	fl.StringVar(&f.namespace, "namespace", defaultImagesNamespace, "containerd namespace for --import")
	fl.StringSliceVar(&f.snapshotters, "snapshotter", []string{"overlayfs", "native"}, "snapshotters --import tries in order to unpack the images")
	return cmd
}

func runImagesBuild(cmd *cobra.Command, f imagesBuildFlags) error {
	if !f.doImport {
		for _, name := range []string{"containerd-socket", "namespace", "snapshotter"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s applies only with --import", name)
			}
		}
	}
	if f.doImport && (f.socket == "" || f.namespace == "") {
		return errors.New("--import needs a --containerd-socket and a --namespace")
	}
	ctx := cmd.Context()
	res, err := images.Build(ctx, f.opts)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	names := []string{images.StokeImage, images.EngineImage}
	for _, name := range names {
		fmt.Fprintf(out, "%s %s %s\n", res.Refs[name], res.Digests[name], res.Archives[name])
	}
	if !f.doImport {
		return nil
	}
	for _, name := range names {
		imported, err := images.ImportArchive(ctx, res.Archives[name], images.ImportOptions{
			Socket: f.socket, Namespace: f.namespace, Snapshotters: f.snapshotters,
		})
		if err != nil {
			return fmt.Errorf("--import: %w", err)
		}
		for _, im := range imported {
			fmt.Fprintf(out, "imported %s into containerd namespace %s (snapshotter %s)\n", im.Name, f.namespace, im.Snapshotter)
		}
	}
	return nil
}
