package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/access"
	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// `raftlockd auth new|inspect|revoke|revoked` and `raftlockd tc trust
// add|list|remove`: certificates and the island's access lists. The new
// and inspect commands work on files only; revoke, revoked and trust call
// a server with a server bundle.

func newAuthCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "auth", Short: "Issue and inspect certificate bundles; revoke client certificates",
		Long: `Certificates for raftlockd's mutual TLS. A bundle is one PEM file holding a
certificate, its private key and the CA that issued it (a CA's and a server's
bundle also hold the gossip key the cluster's servers share). The role of a
certificate (server, client, tcclient) and a client's namespace permissions
are SAN URIs: raftlockd://role/client, raftlockd://ns/orders?perm=rw.

  new       issue a CA, server, client or TC client bundle, or a whole cluster's
  inspect   show what a bundle holds
  revoke    put a client certificate on the island's replicated denylist
  revoked   list the denylist`}
	cmd.AddCommand(newAuthNewCmd(), newInspectCmd(), newAuthExtendCmd(), newRevokeCmd(), newRevokedCmd())
	return cmd
}

// issueFlags are the flags every `auth new` command shares.
type issueFlags struct {
	out      string
	name     string
	validity string
	force    bool
}

func (f *issueFlags) register(cmd *cobra.Command, defaultName string) {
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "", "file to write the bundle to (mode 0600)")
	fl.StringVar(&f.name, "name", defaultName, "the certificate's common name")
	fl.StringVar(&f.validity, "validity", "", "how long the certificate is valid, e.g. 8760h or 365d (default: a year; ten for a CA)")
	fl.BoolVar(&f.force, "force", false, "replace an existing file")
	_ = cmd.MarkFlagRequired("out")
}

func (f *issueFlags) options() (auth.IssueOptions, error) {
	o := auth.IssueOptions{Name: f.name}
	var err error
	o.Validity, err = parseValidity(f.validity)
	return o, err
}

// maxValidityDays keeps a validity in days within a time.Duration (about
// 292 years), where a larger count would wrap to a short or negative one.
const maxValidityDays = 100 * 365

// parseValidity reads a Go duration or a number of days ("90d"); "" is 0
// (the default validity).
func parseValidity(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok && err != nil {
		var n int
		if n, err = strconv.Atoi(days); err == nil {
			if n > maxValidityDays {
				return 0, fmt.Errorf("--validity %q: at most %dd", s, maxValidityDays)
			}
			d = time.Duration(n) * 24 * time.Hour
		}
	}
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--validity %q: want a positive duration such as 8760h or 365d", s)
	}
	return d, nil
}

// writeBundle stores b at path (mode 0600) unless a file is there and
// force is not set, and reports it on w.
func writeBundle(w io.Writer, path string, b *auth.Bundle, force bool) error {
	if _, err := os.Stat(path); err == nil && !force {
		return fmt.Errorf("%s exists; pass --force to replace it", path)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := b.WriteFile(path); err != nil {
		return err
	}
	id, err := b.Identity()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "wrote %s bundle %s (%q, serial %s, valid until %s)\n", id.Role, path, id.Name, id.Serial,
		id.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// loadCA reads the CA bundle that signs a new certificate.
func loadCA(path string) (*auth.Bundle, error) {
	if path == "" {
		return nil, errors.New("--ca is required: the CA bundle (from `raftlockd auth new ca`) that signs the certificate")
	}
	ca, err := auth.LoadBundle(path)
	if err != nil {
		return nil, err
	}
	if !ca.Cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA bundle", path)
	}
	return ca, nil
}

func newAuthNewCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "new", Short: "Issue a CA, a server, client or TC client bundle, or a whole cluster's bundles"}
	// issue is a command signing a role's certificate; its flags adds the
	// role's own flags and returns what completes the options from them.
	issue := func(role auth.Role, use, short, defaultName string, flags func(*cobra.Command) func(*auth.IssueOptions) error) *cobra.Command {
		var f issueFlags
		var caPath string
		sub := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}
		f.register(sub, defaultName)
		sub.Flags().StringVar(&caPath, "ca", "", "the CA bundle that signs the certificate")
		complete := flags(sub)
		sub.RunE = func(cmd *cobra.Command, _ []string) error {
			ca, err := loadCA(caPath)
			if err != nil {
				return err
			}
			o, err := f.options()
			if err != nil {
				return err
			}
			if err := complete(&o); err != nil {
				return err
			}
			b, err := ca.Issue(role, o)
			if err != nil {
				return err
			}
			return writeBundle(cmd.OutOrStdout(), f.out, b, f.force)
		}
		return sub
	}
	server := issue(auth.RoleServer, "server --ca CA.pem --out FILE --host H [--host H ...]",
		"Issue a server bundle: a node's certificate, valid for its host names and addresses", "",
		func(c *cobra.Command) func(*auth.IssueOptions) error {
			var hosts []string
			var node string
			c.Flags().StringArrayVar(&hosts, "host", nil, "DNS name or IP address the node is reached at (repeatable, at least one; the first is the default --name)")
			c.Flags().StringVar(&node, "node-id", "", "bind the certificate to this node id: a server started with it runs as that node "+
				"and no other, and its peers refuse it under another id")
			return func(o *auth.IssueOptions) error {
				if len(hosts) == 0 {
					return errors.New("--host is required: the names and addresses clients and peers reach the node at")
				}
				if o.Name == "" {
					o.Name = hosts[0]
				}
				o.Hosts, o.Node = hosts, node
				return nil
			}
		})
	cl := issue(auth.RoleClient, "client --ca CA.pem --out FILE --namespace NS[:r|rw] [--namespace ...]",
		"Issue a client bundle for an application, allowed the namespaces given", "raftlockd client",
		func(c *cobra.Command) func(*auth.IssueOptions) error {
			var namespaces []string
			c.Flags().StringArrayVar(&namespaces, "namespace", nil, "namespace the client may use, as NS (read-write), NS:rw or NS:r; "+
				"* for every namespace (repeatable, at least one)")
			return func(o *auth.IssueOptions) error {
				if len(namespaces) == 0 {
					return errors.New("--namespace is required (for example --namespace orders, --namespace '*:r')")
				}
				for _, s := range namespaces {
					p, err := auth.ParsePerm(s)
					if err != nil {
						return fmt.Errorf("--namespace: %w", err)
					}
					o.Perms = append(o.Perms, p)
				}
				return nil
			}
		})
	tcc := issue(auth.RoleTCClient, "tcclient --ca CA.pem --out FILE",
		"Issue a TC client bundle: decide transactions, read the coordinator's leader, members and RM registry", "raftlockd tcclient",
		func(*cobra.Command) func(*auth.IssueOptions) error {
			return func(*auth.IssueOptions) error { return nil }
		})
	cmd.AddCommand(newCACmd(), server, cl, tcc, newClusterBundlesCmd())
	return cmd
}

func newCACmd() *cobra.Command {
	var f issueFlags
	cmd := &cobra.Command{Use: "ca --out FILE", Short: "Create a certificate authority (with the gossip key its servers share)",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			ca, err := auth.NewCA(o)
			if err != nil {
				return err
			}
			return writeBundle(cmd.OutOrStdout(), f.out, ca, f.force)
		}}
	f.register(cmd, "raftlockd CA")
	return cmd
}

// newClusterBundlesCmd is `auth new cluster`: a CA and every bundle a
// cluster and its clients need, in one directory.
func newClusterBundlesCmd() *cobra.Command {
	var dir, validity string
	var hosts, shared []string
	var force, ifAbsent, bind bool
	cmd := &cobra.Command{
		Use:   "cluster --dir DIR --host H [--host H ...]",
		Short: "Create a CA and the bundles of a cluster: one per node, a client and a TC client bundle",
		Long: `Create, in DIR: ca.pem (the CA), <host>.pem for every --host (a server
bundle valid for that host, localhost, 127.0.0.1, ::1 and every --shared-host),
client.pem (every namespace, read-write) and tcclient.pem. Start each node
with --bundle DIR/<host>.pem; keep ca.pem, which signs further certificates,
away from the nodes. With --bind-node-ids each node's bundle is bound to the
node id <host> (as 'auth new server --node-id' binds one).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || len(hosts) == 0 {
				return errors.New("--dir and at least one --host are required")
			}
			d, err := parseValidity(validity)
			if err != nil {
				return err
			}
			reserved := []string{auth.CAFile, auth.ClientFile, auth.TCClientFile}
			seen := map[string]bool{}
			for _, h := range hosts {
				if h == "" || strings.ContainsAny(h, `/\`) || slices.Contains(reserved, h+".pem") || seen[h] {
					return fmt.Errorf("--host %q: want distinct host names other than ca, client and tcclient", h)
				}
				seen[h] = true
			}
			caPath := filepath.Join(dir, auth.CAFile)
			if _, err := os.Stat(caPath); err == nil {
				switch {
				case ifAbsent:
					fmt.Fprintf(cmd.OutOrStdout(), "%s exists; nothing written\n", caPath)
					return nil
				case !force:
					return fmt.Errorf("%s exists; pass --force to replace the CA and every bundle", caPath)
				}
			}
			ca, err := auth.NewCA(auth.IssueOptions{Name: "raftlockd CA"})
			if err != nil {
				return err
			}
			type file struct {
				name string
				role auth.Role
				o    auth.IssueOptions
			}
			var files []file
			for _, h := range hosts {
				names := []string{h}
				for _, other := range append([]string{"localhost", "127.0.0.1", "::1"}, shared...) {
					if !slices.Contains(names, other) {
						names = append(names, other)
					}
				}
				o := auth.IssueOptions{Name: h, Hosts: names, Validity: d}
				if bind {
					o.Node = h
				}
				files = append(files, file{h + ".pem", auth.RoleServer, o})
			}
			files = append(files,
				file{auth.ClientFile, auth.RoleClient, auth.IssueOptions{Name: "raftlockd client", Validity: d,
					Perms: []auth.Perm{{Namespace: "*", Write: true}}}},
				file{auth.TCClientFile, auth.RoleTCClient, auth.IssueOptions{Name: "raftlockd tcclient", Validity: d}})
			for _, f := range files {
				b, err := ca.Issue(f.role, f.o)
				if err != nil {
					return err
				}
				if err := writeBundle(cmd.OutOrStdout(), filepath.Join(dir, f.name), b, true); err != nil {
					return err
				}
			}
			// The CA last: --if-absent takes ca.pem for a finished run, so
			// a run that stopped part way is done again in full rather than
			// leaving the bundles it did not write missing for good.
			return writeBundle(cmd.OutOrStdout(), caPath, ca, true)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory to write the bundles to")
	f.StringArrayVar(&hosts, "host", nil, "a node's host name or address (repeatable): one server bundle each")
	f.StringArrayVar(&shared, "shared-host", nil, "a name or address every node's bundle is valid for as well, "+
		"such as a load balancer's (repeatable)")
	f.StringVar(&validity, "validity", "", "how long the nodes' and clients' certificates are valid (default: a year; the CA ten)")
	f.BoolVar(&force, "force", false, "replace an existing CA and its bundles")
	f.BoolVar(&bind, "bind-node-ids", false, "bind each node's bundle to the node id its --host names: a server runs with it as that node only")
	f.BoolVar(&ifAbsent, "if-absent", false, "do nothing, successfully, when DIR already holds a CA (for one-shot setup containers)")
	return cmd
}

// bundleInfo is what `auth inspect` shows.
type bundleInfo struct {
	File          string    `json:"file"`
	Role          string    `json:"role"`
	Name          string    `json:"name"`
	Serial        string    `json:"serial"`
	Fingerprint   string    `json:"fingerprint"`
	NotBefore     time.Time `json:"not_before"`
	NotAfter      time.Time `json:"not_after"`
	Expired       bool      `json:"expired"`
	Namespaces    []string  `json:"namespaces,omitempty"`
	Hosts         []string  `json:"hosts,omitempty"`
	Node          string    `json:"node_id,omitempty"` // the node id a server certificate is bound to
	CA            string    `json:"ca"`
	CAFingerprint string    `json:"ca_fingerprint"`
	GossipKey     bool      `json:"gossip_key"`
	// The CAs trusted besides the first and the gossip keys read besides
	// the one sent with: a bundle extended for a move to a new CA.
	ExtraCAs           []string `json:"extra_cas,omitempty"`
	AcceptedGossipKeys int      `json:"accepted_gossip_keys,omitempty"`
}

func inspectBundle(path string) (*bundleInfo, error) {
	b, err := auth.LoadBundle(path)
	if err != nil {
		return nil, err
	}
	id, err := b.Identity()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c := b.Cert
	info := &bundleInfo{File: path, Role: string(id.Role), Name: id.Name, Serial: id.Serial, Fingerprint: auth.Fingerprint(c),
		NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC(), Expired: time.Now().After(c.NotAfter),
		Hosts: c.DNSNames, Node: id.Node, CAFingerprint: id.CA, GossipKey: len(b.GossipKey) > 0, AcceptedGossipKeys: len(b.GossipKeys()) - 1}
	if info.AcceptedGossipKeys < 0 {
		info.AcceptedGossipKeys = 0
	}
	for i, ca := range b.CAs {
		if i > 0 && !ca.Equal(c) {
			info.ExtraCAs = append(info.ExtraCAs, ca.Subject.CommonName+" ("+auth.Fingerprint(ca)+")")
		}
	}
	for _, ip := range c.IPAddresses {
		info.Hosts = append(info.Hosts, ip.String())
	}
	for _, p := range id.Perms {
		mode := "r"
		if p.Write {
			mode = "rw"
		}
		info.Namespaces = append(info.Namespaces, p.Namespace+":"+mode)
	}
	if len(b.CAs) > 0 {
		info.CA = b.CAs[0].Subject.CommonName
	}
	return info, nil
}

// newAuthExtendCmd is `auth extend`: the bridge bundles of a move to a new CA.
func newAuthExtendCmd() *cobra.Command {
	var with, out string
	cmd := &cobra.Command{
		Use:   "extend BUNDLE --with OTHER.pem [--out FILE]",
		Short: "Make a bundle also trust another CA and read its gossip key",
		Long: `Extend writes BUNDLE (or --out) so that it also trusts the CA certificates of
OTHER.pem and reads the gossip keys OTHER.pem holds, while still presenting
its own certificate and sending gossip with its own key. A cluster moves to
a new CA without a restart in three rounds of SIGHUP, node by node:

  1. raftlockd auth extend node.pem --with new-ca.pem            (old certificate, trusts both)
  2. raftlockd auth extend new-node.pem --with old-ca.pem --out node.pem
                                                                  (new certificate, trusts both)
  3. cp new-node.pem node.pem                                     (the new CA alone)

Clients do the same with their bundles between rounds 1 and 3.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if with == "" {
				return errors.New("--with is required: the bundle (a CA's, or any of its bundles) whose CA to add")
			}
			b, err := auth.LoadBundle(args[0])
			if err != nil {
				return err
			}
			other, err := auth.LoadBundle(with)
			if err != nil {
				return err
			}
			if len(other.CAs) == 0 {
				return fmt.Errorf("%s holds no CA certificate", with)
			}
			if out == "" {
				out = args[0]
			}
			return writeBundle(cmd.OutOrStdout(), out, b.Extend(other), true)
		},
	}
	cmd.Flags().StringVar(&with, "with", "", "the bundle whose CA certificates and gossip keys to add")
	cmd.Flags().StringVar(&out, "out", "", "where to write the extended bundle (default: BUNDLE itself)")
	return cmd
}

func newInspectCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "inspect BUNDLE",
		Short: "Show a bundle's role, name, serial, validity, namespaces, hosts and CA",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			info, err := inspectBundle(args[0])
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), format, info, func(w *tabwriter.Writer) {
				gossip := "no"
				if info.GossipKey {
					gossip = "yes"
				}
				if info.AcceptedGossipKeys > 0 {
					gossip += fmt.Sprintf(" (and reads %d more)", info.AcceptedGossipKeys)
				}
				validity := info.NotBefore.Format(time.RFC3339) + " to " + info.NotAfter.Format(time.RFC3339)
				if info.Expired {
					validity += " (expired)"
				}
				for _, kv := range [][2]string{
					{"file", info.File}, {"role", info.Role}, {"name", info.Name}, {"serial", info.Serial},
					{"fingerprint", info.Fingerprint}, {"valid", validity},
					{"namespaces", dash(strings.Join(info.Namespaces, ", "))}, {"hosts", dash(strings.Join(info.Hosts, ", "))},
					{"node id", dash(info.Node)}, {"ca", info.CA + " (" + info.CAFingerprint + ")"}, {"also trusts", dash(strings.Join(info.ExtraCAs, ", "))},
					{"gossip key", gossip},
				} {
					fmt.Fprintf(w, "%s\t%s\n", kv[0], kv[1])
				}
			})
		},
	}
	addFormatFlag(cmd.Flags(), &format)
	return cmd
}

func newRevokeCmd() *cobra.Command {
	o := &adminOpts{}
	var reason string
	cmd := &cobra.Command{
		Use:   "revoke client|tcclient SERIAL",
		Short: "Refuse a client or TC client certificate from now on (the island's replicated denylist)",
		Long: `Put a certificate's serial (hex, as 'raftlockd auth inspect' shows it) on the
island's denylist. The denylist is replicated through Raft: every node refuses
the certificate (certificate_revoked) as soon as it has applied the entry, and
after restores. Node certificates are replaced by rotating the cluster's
bundles instead.`,
		Args: cobra.MatchAll(cobra.ExactArgs(2), func(_ *cobra.Command, args []string) error {
			if args[0] != string(auth.RoleClient) && args[0] != string(auth.RoleTCClient) {
				return fmt.Errorf("%q: revoke client SERIAL or tcclient SERIAL", args[0])
			}
			return nil
		}),
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, args []string) (*wire.RevokeResponse, error) {
			return c.Revoke(ctx, args[1], reason)
		}, func(w io.Writer, out *wire.RevokeResponse) {
			if out.Changed {
				fmt.Fprintf(w, "revoked %s\n", out.Revocation.Serial)
			} else {
				fmt.Fprintf(w, "%s was already revoked\n", out.Revocation.Serial)
			}
		}),
	}
	addAdminFlags(cmd, o, true, auth.ServerFile, "")
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept with the entry")
	bindEnv(cmd, clientEnv)
	return cmd
}

func newRevokedCmd() *cobra.Command {
	o := &adminOpts{}
	cmd := &cobra.Command{
		Use:   "revoked",
		Short: "List the revoked certificate serials",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.RevocationsResponse, error) {
			return c.Revocations(ctx)
		}, func(w io.Writer, out *wire.RevocationsResponse) {
			fmt.Fprintln(w, "SERIAL\tREVOKED AT\tREASON")
			for _, r := range out.Revoked {
				fmt.Fprintf(w, "%s\t%s\t%s\n", r.Serial, time.Unix(r.RevokedAt, 0).UTC().Format(time.RFC3339), dash(r.Reason))
			}
		}),
	}
	addAdminFlags(cmd, o, true, auth.ServerFile, "")
	bindEnv(cmd, clientEnv)
	return cmd
}

// readCA reads the CA certificate of a PEM file: a CA's bundle, its bare
// certificate, or any bundle it issued (whose CA is taken). Only the
// certificate goes to the server, never a key.
func readCA(path string) (*x509.Certificate, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if b, err := auth.ParseBundle(raw); err == nil && len(b.CAs) > 0 {
		return b.CAs[0], nil
	}
	ca, err := access.ParseCA(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ca, nil
}

// newTrustCmd is `raftlockd tc trust add|list|remove`.
func newTrustCmd(o *adminOpts) *cobra.Command {
	var name string
	cmd := &cobra.Command{Use: "trust", Short: "The CAs, besides the island's own, whose servers and TC clients may call the coordinator",
		Long: `The island's trust list, replicated through Raft. Servers with a certificate
of a trusted CA may call the coordinator and resource-manager endpoints
(/v1/txn/prepare|commit|rollback, /v1/tc/cluster/announce|leave,
/v1/tc/rm/register|unregister), and its TC clients the coordinator's client
endpoints: how islands with CAs of their own run transactions together.
Every other endpoint accepts only the island's own CA.`}
	useBundle(auth.ServerFile, cmd)
	entries := func(w io.Writer, list []wire.TrustedCA) {
		fmt.Fprintln(w, "FINGERPRINT\tNAME\tSUBJECT\tNOT AFTER\tADDED AT")
		for _, t := range list {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.Fingerprint, dash(t.Name), t.Subject,
				time.Unix(t.NotAfter, 0).UTC().Format(time.RFC3339), time.Unix(t.AddedAt, 0).UTC().Format(time.RFC3339))
		}
	}
	add := &cobra.Command{
		Use:   "add CA.pem",
		Short: "Trust the CA in CA.pem (its certificate, its bundle, or a bundle it issued)",
		Args:  cobra.ExactArgs(1),
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, args []string) (*wire.TrustResponse, error) {
			ca, err := readCA(args[0])
			if err != nil {
				return nil, err
			}
			return c.Trust(ctx, name, ca)
		}, func(w io.Writer, out *wire.TrustResponse) {
			if out.Trusted != nil {
				entries(w, []wire.TrustedCA{*out.Trusted})
			}
		}),
	}
	add.Flags().StringVar(&name, "name", "", "a name for the CA (default: its common name)")
	addSubcommands(cmd, add, &cobra.Command{
		Use:   "list",
		Short: "List the trusted CAs",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TrustListResponse, error) {
			return c.TrustedCAs(ctx)
		}, func(w io.Writer, out *wire.TrustListResponse) { entries(w, out.Trusted) }),
	}, &cobra.Command{
		Use:   "remove FINGERPRINT",
		Short: "Stop trusting the CA with FINGERPRINT (SHA-256, as list shows it)",
		Args:  cobra.ExactArgs(1),
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, args []string) (*wire.TrustResponse, error) {
			return c.Untrust(ctx, args[0])
		}, func(w io.Writer, out *wire.TrustResponse) {
			if out.Changed {
				fmt.Fprintln(w, "removed")
			} else {
				fmt.Fprintln(w, "not on the trust list")
			}
		}),
	})
	return cmd
}
