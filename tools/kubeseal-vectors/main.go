// Command kubeseal-vectors seals and unseals with the code of kubeseal itself (github.com/bitnami-labs/sealed-secrets
// pkg/kubeseal at the version go.mod pins), to make test vectors for the collection's sealing helpers that do not
// come from the collection:
//
//	kubeseal-vectors seal --cert CERT.pem [--scope strict|namespace-wide|cluster-wide] < secret.json > sealedsecret.json
//	kubeseal-vectors unseal --key KEY.pem < sealedsecret.json > secret.json
//
// seal is kubeseal.Seal (what `kubeseal --cert CERT --scope S -o json` runs); unseal is kubeseal.UnsealSealedSecret
// (what `kubeseal --recovery-unseal --recovery-private-key KEY -o json` runs). The Kubernetes client configuration
// kubeseal.Seal asks for the default namespace has none here: an input Secret names its namespace.
package main

import (
	"crypto/rsa"
	"flag"
	"fmt"
	"os"

	ssv1alpha1 "github.com/bitnami/sealed-secrets/pkg/apis/sealedsecrets/v1alpha1"
	"github.com/bitnami/sealed-secrets/pkg/kubeseal"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// noCluster is the client configuration of a kubeseal run without a cluster: no default namespace.
type noCluster struct{}

func (noCluster) ClientConfig() (*rest.Config, error) {
	return nil, fmt.Errorf("kubeseal-vectors talks to no cluster")
}

func (noCluster) Namespace() (string, bool, error) { return "", false, nil }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubeseal-vectors seal --cert CERT [--scope SCOPE] | unseal --key KEY (input on stdin)")
		os.Exit(2)
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	cert := flags.String("cert", "", "PEM certificate of the sealing key (seal)")
	key := flags.String("key", "", "PEM private key (unseal)")
	var scope ssv1alpha1.SealingScope
	flags.Var(&scope, "scope", "strict, namespace-wide or cluster-wide (seal; default: the Secret's annotations)")
	_ = flags.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "seal":
		var in *os.File
		if in, err = os.Open(*cert); err == nil {
			defer in.Close()
			var pub *rsa.PublicKey
			if pub, err = kubeseal.ParseKey(in); err == nil {
				err = kubeseal.Seal(noCluster{}, "json", os.Stdin, os.Stdout, scheme.Codecs, pub, scope, false, "", "")
			}
		}
	case "unseal":
		err = kubeseal.UnsealSealedSecret(os.Stdout, os.Stdin, []string{*key}, "json", scheme.Codecs)
	default:
		err = fmt.Errorf("unknown command %q (seal or unseal)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeseal-vectors:", err)
		os.Exit(1)
	}
}
