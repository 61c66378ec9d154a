package main

import (
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/netsec"
	"github.com/spf13/cobra"
)

// newCerts is `kvstream certs`: development TLS material for --tls-dir.
func newCerts() *cobra.Command {
	var hosts, nodes []string
	cmd := &cobra.Command{
		Use:   "certs DIR",
		Short: "Write a development CA and node certificates for mutual TLS on the control plane",
		Long: `certs writes a development CA (` + netsec.CAFile + `, ` + netsec.CAKeyFile + `) and one certificate and key per node
(NODE.pem, NODE.key) into DIR, for --tls-dir of kvstream decode and prefill. Every certificate names
127.0.0.1, ::1, localhost and the --hosts (the addresses peers dial: what each node advertises). It
never overwrites a file. ` + netsec.CAKeyFile + ` signs anything: keep it off the nodes; use your own CA in
production.`,
		Args: oneArg("DIR", "the directory to write the certificates into"),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Before anything is written: each host goes into every
			// certificate as an IP address or a DNS name.
			for _, h := range hosts {
				if err := netsec.CheckHost(h); err != nil {
					return errors.Wrap(err, "--hosts")
				}
			}
			files, err := netsec.GenerateDevCerts(args[0], nodes, hosts)
			if err != nil {
				return err
			}
			for _, name := range nodes {
				fmt.Fprintf(cmd.OutOrStdout(), "certs: %s: %s %s (CA %s)\n", name, files[name].Cert, files[name].Key, files[name].CA)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&hosts, "hosts", nil, "more IP addresses or host names (letters, digits, '-' and '.'; no port or wildcard) every certificate names (comma-separated)")
	cmd.Flags().StringSliceVar(&nodes, "nodes", []string{"decode", "prefill"}, "node names, one certificate each (the certificate's name)")
	return cmd
}
