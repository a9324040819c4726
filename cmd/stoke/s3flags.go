package main

import (
	"github.com/spf13/pflag"

	"github.com/stokehq/stoke/weightstore/bucket"
)

// s3Flags are the S3 settings every command that opens buckets takes; the
// AWS_* environment supplies whatever they leave unset.
type s3Flags struct {
	flags            *pflag.FlagSet
	endpoint, region string
	pathStyle        bool
}

func addS3Flags(fs *pflag.FlagSet) *s3Flags {
	s := &s3Flags{flags: fs}
	fs.StringVar(&s.endpoint, "endpoint", "", "S3 endpoint, e.g. http://127.0.0.1:9000 (default $AWS_ENDPOINT_URL, else AWS)")
	fs.StringVar(&s.region, "region", "", "S3 region (default $AWS_REGION)")
	fs.BoolVar(&s.pathStyle, "path-style", false, "path-style S3 addressing (http://host/bucket/key)")
	return s
}

// options merges the flags over the environment.
func (s *s3Flags) options() bucket.S3Options {
	o := bucket.S3OptionsFromEnv()
	if s.flags.Changed("endpoint") {
		o.Endpoint = s.endpoint
	}
	if s.flags.Changed("region") {
		o.Region = s.region
	}
	if s.flags.Changed("path-style") {
		o.PathStyle = s.pathStyle
	}
	return o
}
