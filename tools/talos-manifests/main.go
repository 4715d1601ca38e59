// talos-manifests prints the Kubernetes manifests a Talos v1.13.9 control plane applies to its cluster, rendered by
// Talos's own templates (internal/app/machined/pkg/controllers/k8s/internal/k8stemplates at the version in go.mod),
// for the lab's upstream Kubernetes world (lab/k8s_upstream/manifests.py), which applies them as Talos does.
//
//	talos-manifests < machine-config.yaml
//
// Answer on stdout, one JSON object:
//
//	{"manifests": [{"id": "00-kubelet-bootstrapping-token", "objects": [{...}, ...]}, ...],   sorted by id
//	 "urls": [{"id": "05-https://...", "url": "https://..."}, ...]}                           not fetched here
//
// Exit code 1 with {"error": "..."} when the config cannot be decoded or a manifest cannot be rendered.
//
// Why the module path is github.com/siderolabs/talos/internal/app/machined/pkg/controllers/k8s/labmanifests: the
// templates live in an internal package of the Talos module, which the go command lets a package import only when
// the importer's import path lies under .../controllers/k8s (cmd/go disallowInternal compares import paths in
// module mode). Nothing of this module is published; the path is only what makes Talos's own code importable.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/runtime"

	k8sadapter "github.com/siderolabs/talos/internal/app/machined/pkg/adapters/k8s"
	"github.com/siderolabs/talos/internal/app/machined/pkg/controllers/k8s/internal/k8stemplates"
	"github.com/siderolabs/talos/pkg/argsbuilder"
	"github.com/siderolabs/talos/pkg/images"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/secrets"
)

type manifest struct {
	ID      string           `json:"id"`
	Objects []map[string]any `json:"objects"`
}

type urlManifest struct {
	ID  string `json:"id"`
	URL string `json:"url"`
}

func main() {
	text, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}

	cfg, err := configloader.NewFromBytes(text)
	if err != nil {
		fail(fmt.Errorf("decoding the machine config: %w", err))
	}

	if cfg.Cluster() == nil {
		fail(errors.New("cluster: the machine config has no cluster section"))
	}

	manifests, err := bootstrapManifests(cfg)
	if err != nil {
		fail(err)
	}

	inline, urls, err := extraManifests(cfg)
	if err != nil {
		fail(err)
	}

	manifests = append(manifests, inline...)

	// ManifestApplyController sorts the Manifest resources by id before it applies them (manifest_apply.go:132-134)
	sort.SliceStable(manifests, func(i, j int) bool { return manifests[i].ID < manifests[j].ID })

	out, err := json.Marshal(map[string]any{"manifests": manifests, "urls": urls})
	if err != nil {
		fail(err)
	}

	fmt.Println(string(out))
}

func fail(err error) {
	out, _ := json.Marshal(map[string]string{"error": err.Error()}) //nolint:errcheck
	fmt.Println(string(out))
	os.Exit(1)
}

// bootstrapManifestsConfig is the spec ControlPlaneBootstrapManifestsController derives from the machine config
// (control_plane.go:296-372).
func bootstrapManifestsConfig(cfgProvider talosconfig.Config) (k8s.BootstrapManifestsConfigSpec, error) {
	dnsServiceIPs, err := cfgProvider.Cluster().Network().DNSServiceIPs()
	if err != nil {
		return k8s.BootstrapManifestsConfigSpec{}, fmt.Errorf("cluster.network.serviceSubnets: error calculating DNS service IPs: %w", err)
	}

	dnsServiceIP, dnsServiceIPv6 := "", ""

	for _, ip := range dnsServiceIPs {
		if dnsServiceIP == "" && ip.Is4() {
			dnsServiceIP = ip.String()
		}

		if dnsServiceIPv6 == "" && ip.Is6() {
			dnsServiceIPv6 = ip.String()
		}
	}

	imageList := images.List(cfgProvider)

	proxyArgs, err := proxyArgs(cfgProvider)
	if err != nil {
		return k8s.BootstrapManifestsConfigSpec{}, fmt.Errorf("cluster.proxy.extraArgs: %w", err)
	}

	var server, flannelHost, flannelPort string

	if cfgProvider.Machine().Features().KubePrism().Enabled() {
		server = fmt.Sprintf("https://127.0.0.1:%d", cfgProvider.Machine().Features().KubePrism().Port())
		flannelHost = "127.0.0.1"
		flannelPort = strconv.Itoa(cfgProvider.Machine().Features().KubePrism().Port())
	} else {
		server = cfgProvider.Cluster().Endpoint().String()
	}

	return k8s.BootstrapManifestsConfigSpec{
		Server:                            server,
		ClusterDomain:                     cfgProvider.Cluster().Network().DNSDomain(),
		PodCIDRs:                          cfgProvider.Cluster().Network().PodCIDRs(),
		ProxyEnabled:                      cfgProvider.Cluster().Proxy().Enabled(),
		ProxyImage:                        cfgProvider.Cluster().Proxy().Image(),
		ProxyArgs:                         proxyArgs,
		CoreDNSEnabled:                    cfgProvider.Cluster().CoreDNS().Enabled(),
		CoreDNSImage:                      cfgProvider.Cluster().CoreDNS().Image(),
		DNSServiceIP:                      dnsServiceIP,
		DNSServiceIPv6:                    dnsServiceIPv6,
		FlannelEnabled:                    cfgProvider.Cluster().Network().CNI().Name() == constants.FlannelCNI,
		FlannelImage:                      imageList.Flannel.String(),
		FlannelExtraArgs:                  cfgProvider.Cluster().Network().CNI().Flannel().ExtraArgs(),
		FlannelKubeServiceHost:            flannelHost,
		FlannelKubeServicePort:            flannelPort,
		FlannelKubeNetworkPoliciesEnabled: cfgProvider.Cluster().Network().CNI().Flannel().KubeNetworkPoliciesEnabled(),
		FlannelKubeNetworkPoliciesImage:   imageList.KubeNetworkPolicies.String(),
		TalosAPIServiceEnabled:            cfgProvider.Machine().Features().KubernetesTalosAPIAccess().Enabled(),
		CNIName:                           cfgProvider.Cluster().Network().CNI().Name(),
	}, nil
}

// proxyArgs is getProxyArgs of control_plane.go:476-507 (an unexported function of a package that needs the whole
// controller runtime): kube-proxy's arguments, its mode nftables from Kubernetes 1.31 on unless cluster.proxy.mode says.
func proxyArgs(cfgProvider talosconfig.Config) ([]string, error) {
	proxyMode := cfgProvider.Cluster().Proxy().Mode()

	if proxyMode == "" {
		if imageVersionAtLeast(cfgProvider.Cluster().Proxy().Image(), semver.MustParse("1.31.0")) {
			proxyMode = "nftables"
		} else {
			proxyMode = "iptables"
		}
	}

	builder := argsbuilder.Args{
		"cluster-cidr":           {strings.Join(cfgProvider.Cluster().Network().PodCIDRs(), ",")},
		"hostname-override":      {"$(NODE_NAME)"},
		"kubeconfig":             {"/etc/kubernetes/kubeconfig"},
		"proxy-mode":             {proxyMode},
		"conntrack-max-per-core": {"0"},
	}

	if err := builder.Merge(cfgProvider.Cluster().Proxy().ExtraArgs(),
		argsbuilder.WithMergePolicies(argsbuilder.MergePolicies{"kubeconfig": argsbuilder.MergeDenied})); err != nil {
		return nil, err
	}

	return builder.Args(), nil
}

// imageVersionAtLeast answers what VersionGTE of github.com/siderolabs/talos@v1.13.9 pkg/kubernetes/version.go:15-37
// answers (its package needs github.com/siderolabs/go-kubernetes, which the module proxy here refuses): whether the
// image's tag, read as a version and stripped of its pre-release part, is at least minimum; false when the image
// reference has no tag or either does not parse.
func imageVersionAtLeast(image string, minimum semver.Version) bool {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return false
	}

	tagged, isTagged := named.(reference.Tagged)
	if !isTagged {
		return false
	}

	tagVersion, err := semver.ParseTolerant(tagged.Tag())
	if err != nil {
		return false
	}

	tagVersion.Pre = nil

	return tagVersion.GTE(minimum)
}

// bootstrapManifests is ManifestController.render (manifest.go:148-255): the manifests and, in each, the objects in
// the order Talos lists them.
func bootstrapManifests(cfgProvider talosconfig.Config) ([]manifest, error) {
	cfg, err := bootstrapManifestsConfig(cfgProvider)
	if err != nil {
		return nil, err
	}

	// the fields of the KubernetesRoot secrets the templates read (secrets/root.go:139-140)
	scrt := &secrets.KubernetesRootSpec{
		BootstrapTokenID:     cfgProvider.Cluster().Token().ID(),
		BootstrapTokenSecret: cfgProvider.Cluster().Token().Secret(),
	}

	type named struct {
		id   string
		objs []runtime.Object
	}

	rendered := []named{
		{"00-kubelet-bootstrapping-token", []runtime.Object{k8stemplates.KubeletBootstrapTokenSecret(scrt)}},
		{"01-csr-node-bootstrap", []runtime.Object{k8stemplates.CSRNodeBootstrapTemplate()}},
		{"01-csr-approver-role-binding", []runtime.Object{k8stemplates.CSRApproverRoleBindingTemplate()}},
		{"01-csr-renewal-role-binding", []runtime.Object{k8stemplates.CSRRenewalRoleBindingTemplate()}},
		{"11-kube-config-in-cluster", []runtime.Object{k8stemplates.KubeconfigInClusterTemplate(&cfg)}},
		{"11-talos-node-rbac-template", []runtime.Object{
			k8stemplates.TalosNodesRBACClusterRoleBinding(), k8stemplates.TalosNodesRBACClusterRole(),
		}},
	}

	if cfg.CoreDNSEnabled {
		rendered = append(rendered,
			named{"11-core-dns", []runtime.Object{
				k8stemplates.CoreDNSServiceAccount(), k8stemplates.CoreDNSClusterRole(), k8stemplates.CoreDNSClusterRoleBinding(),
				k8stemplates.CoreDNSConfigMap(&cfg), k8stemplates.CoreDNSDeployment(&cfg),
			}},
			named{"11-core-dns-svc", []runtime.Object{k8stemplates.CoreDNSService(&cfg)}},
		)
	}

	if cfg.FlannelEnabled {
		rendered = append(rendered, named{"05-flannel", []runtime.Object{
			k8stemplates.FlannelClusterRoleTemplate(&cfg), k8stemplates.FlannelClusterRoleBindingTemplate(),
			k8stemplates.FlannelServiceAccountTemplate(), k8stemplates.FlannelConfigMapTemplate(&cfg),
			k8stemplates.FlannelDaemonSetTemplate(&cfg),
		}})
	}

	if cfg.ProxyEnabled {
		rendered = append(rendered, named{"10-kube-proxy", []runtime.Object{
			k8stemplates.KubeProxyDaemonSetTemplate(&cfg), k8stemplates.KubeProxyServiceAccount(), k8stemplates.KubeProxyClusterRoleBinding(),
		}})
	}

	if cfg.PodSecurityPolicyEnabled {
		return nil, errors.New("pod security policies are not supported anymore, please remove the flag from the configuration")
	}

	if cfg.TalosAPIServiceEnabled {
		rendered = append(rendered, named{"13-talos-service-account-crd", []runtime.Object{k8stemplates.TalosServiceAccountCRDTemplate()}})
	}

	out := make([]manifest, 0, len(rendered))

	for _, item := range rendered {
		// the Manifest resource stores them through the adapter's SetObjects (manifest.go:110-113)
		res := k8s.NewManifest(k8s.ControlPlaneNamespaceName, item.id)
		if err := k8sadapter.Manifest(res).SetObjects(item.objs); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", item.id, err)
		}

		out = append(out, fromResource(res))
	}

	return out, nil
}

// extraManifests is ControlPlaneExtraManifestsController (control_plane.go:392-437) with ExtraManifestController's
// ids (extra_manifest.go:147-156, "<priority>-<name>") and its inline parse (processInline, extra_manifest.go:227-235).
// URL manifests are listed, not downloaded.
func extraManifests(cfgProvider talosconfig.Config) ([]manifest, []urlManifest, error) {
	urls := []urlManifest{}

	for _, url := range cfgProvider.Cluster().Network().CNI().URLs() {
		urls = append(urls, urlManifest{"05-" + url, url})
	}

	for _, url := range cfgProvider.Cluster().ExternalCloudProvider().ManifestURLs() {
		urls = append(urls, urlManifest{"30-" + url, url})
	}

	for _, url := range cfgProvider.Cluster().ExtraManifestURLs() {
		urls = append(urls, urlManifest{"99-" + url, url})
	}

	inline := []manifest{}

	for _, item := range cfgProvider.Cluster().InlineManifests() {
		id := "99-" + item.Name()
		res := k8s.NewManifest(k8s.ControlPlaneNamespaceName, id)

		if err := k8sadapter.Manifest(res).SetYAML([]byte(item.Contents())); err != nil {
			return nil, nil, fmt.Errorf("cluster.inlineManifests %q: %w", item.Name(), err)
		}

		inline = append(inline, fromResource(res))
	}

	return inline, urls, nil
}

func fromResource(res *k8s.Manifest) manifest {
	objs := k8sadapter.Manifest(res).Objects()
	out := manifest{ID: res.Metadata().ID(), Objects: make([]map[string]any, 0, len(objs))}

	for _, obj := range objs {
		out.Objects = append(out.Objects, obj.Object)
	}

	return out
}
