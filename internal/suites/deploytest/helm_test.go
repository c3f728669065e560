package deploytest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/internal/testkit/relaybin"
)

type k8sService struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		Type     string            `yaml:"type"`
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
			Protocol   string `yaml:"protocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type k8sServiceAccount struct {
	APIVersion                   string  `yaml:"apiVersion"`
	Kind                         string  `yaml:"kind"`
	Metadata                     k8sMeta `yaml:"metadata"`
	AutomountServiceAccountToken *bool   `yaml:"automountServiceAccountToken"`
}

type k8sConfigMap struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   k8sMeta           `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
}

type k8sServiceMonitor struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		Selector  labelSelector `yaml:"selector"`
		Endpoints []struct {
			Port          string `yaml:"port"`
			Path          string `yaml:"path"`
			Interval      string `yaml:"interval"`
			ScrapeTimeout string `yaml:"scrapeTimeout"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

type k8sPrometheusRule struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		Groups []map[string]any `yaml:"groups"`
	} `yaml:"spec"`
}

func (m *manifests) decodeMore(kind string, doc *yaml.Node) error {
	var err error
	switch kind {
	case "Service":
		var v k8sService
		err = decodeStrict(doc, &v)
		m.services = append(m.services, v)
	case "ServiceAccount":
		var v k8sServiceAccount
		err = decodeStrict(doc, &v)
		m.serviceAccounts = append(m.serviceAccounts, v)
	case "ConfigMap":
		var v k8sConfigMap
		err = decodeStrict(doc, &v)
		m.configMaps = append(m.configMaps, v)
	case "ServiceMonitor":
		var v k8sServiceMonitor
		err = decodeStrict(doc, &v)
		m.serviceMonitors = append(m.serviceMonitors, v)
	case "PrometheusRule":
		var v k8sPrometheusRule
		err = decodeStrict(doc, &v)
		m.prometheusRules = append(m.prometheusRules, v)
	}
	return err
}

const chartDir = "deploy/helm/outbox-relay"

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	bin, err := exec.LookPath("helm")
	if err != nil {
		unavailable(t, "helm not found (scripts/services.sh helm builds it from its Go module)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = root(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %s:\n%s%s", strings.Join(args, " "), out, stderr.String())
	return out
}

func TestHelmLint(t *testing.T) {
	t.Parallel()
	helm(t, "lint", "--strict", chartDir)
	helm(t, "lint", "--strict", chartDir, "-f", chartDir+"/ci/full-values.yaml")
}

// The chart's alert rules are those of deploy/prometheus (a copy, since a
// chart can only read its own files).
func TestHelmAlertRulesAreTheProjects(t *testing.T) {
	t.Parallel()
	require.Equal(t, string(readFile(t, "deploy/prometheus/alerts.yaml")), string(readFile(t, chartDir+"/files/alerts.yaml")),
		"copy deploy/prometheus/alerts.yaml to %s/files/alerts.yaml", chartDir)
}

// The chart renders, with its defaults and with every option set, to
// objects the strict Kubernetes types accept and that pass the checks of
// the repository's own manifests (security, probes, secrets, grace
// period, disruption budget).
func TestHelmTemplate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		values  []string
		full    bool
		secrets bool
	}{
		// No --kube-version: the Kubernetes version helm assumes by
		// itself must satisfy the chart's kubeVersion (a helm built with
		// a bare `go install` assumes 1.20; scripts/services.sh builds it
		// with Helm's own -ldflags).
		{name: "defaults, helm's own Kubernetes version"},
		{name: "defaults", values: []string{"--kube-version", "1.29.0"}},
		{name: "full values", values: []string{"--kube-version", "1.29.0", "-f", chartDir + "/ci/full-values.yaml"}, full: true},
		// Secrets for the sink URL and the console's tokens too: each is
		// mounted so that the relay does not warn (checkSecretFileModes).
		{name: "secrets", values: []string{"--set", "sink.url=", "--set", "sink.existingSecret=relay-sink", "--set", "console.tokensSecret=relay-console"}, secrets: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := helm(t, append([]string{"template", "relay", chartDir, "--namespace", "apps"}, tc.values...)...)
			m := parseManifests(t, "helm template "+tc.name, out)
			if tc.secrets {
				checkChartSecrets(t, m)
				return
			}
			checkChart(t, m, tc.full)
		})
	}
}

// checkChartSecrets checks a rendering whose database URL, sink URL and
// console tokens all come from Secrets: every one is a file the relay reads
// without warning (checkPod runs checkSecretFileModes on each), and the
// pods of the relay and of the migration set an fsGroup.
func checkChartSecrets(t *testing.T, m manifests) {
	require.Len(t, m.deployments, 1, "one Deployment")
	spec := m.deployments[0].Spec.Template.Spec
	runs := checkPod(t, m.file+": Deployment", spec)
	require.Len(t, runs, 1)
	for _, env := range []string{"OUTBOX_DATABASE_URL_FILE", "OUTBOX_SINK_FILE", "OUTBOX_ADMIN_TOKEN_FILE"} {
		_, ok := runs[0].env(env)
		require.True(t, ok, "%s is not set", env)
	}
	require.NotNil(t, spec.SecurityContext.FSGroup)
	require.Len(t, m.jobs, 1, "the migration hook Job")
	checkPod(t, m.file+": Job", m.jobs[0].Spec.Template.Spec)
	require.NotNil(t, m.jobs[0].Spec.Template.Spec.SecurityContext.FSGroup)
}

// The image tag the docs build and push is the one the chart deploys by
// default (its appVersion) and the plain manifests name.
func TestImageTagsAgree(t *testing.T) {
	t.Parallel()
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, chartDir+"/Chart.yaml"), &chart))
	files := []string{"docs/deploy.md", "deploy/kubernetes/deployment.yaml", "deploy/kubernetes/sidecar.yaml"}
	for _, f := range files {
		tags := imageTag.FindAllStringSubmatch(string(readFile(t, f)), -1)
		require.NotEmpty(t, tags, "%s names no registry.example.com/outbox-relay:TAG", f)
		for _, tag := range tags {
			require.Equal(t, chart.AppVersion, tag[1], "%s tags the image %s; the chart deploys %s by default", f, tag[0], chart.AppVersion)
		}
	}
}

var imageTag = regexp.MustCompile(`registry\.example\.com/outbox-relay:([^\s"']+)`)

func checkChart(t *testing.T, m manifests, full bool) {
	require.Len(t, m.deployments, 1, "one Deployment")
	d := m.deployments[0]
	where := m.file + ": Deployment " + d.Metadata.Name
	runs := checkPod(t, where, d.Spec.Template.Spec)
	require.Len(t, runs, 1, "%s runs one relay container", where)
	checkSelector(t, where, d.Spec.Selector, d.Spec.Template.Metadata.Labels)
	relay := runs[0]
	env := relay.settings()
	checkRolloutEnds(t, where, d, env)

	require.Len(t, m.jobs, 1, "the migration hook Job")
	j := m.jobs[0]
	checkPod(t, m.file+": Job "+j.Metadata.Name, j.Spec.Template.Spec)
	require.Equal(t, "migrate", subcommand(j.Spec.Template.Spec.Containers[0]))
	require.Equal(t, "pre-install,pre-upgrade", j.Metadata.Annotations["helm.sh/hook"])

	require.Len(t, m.pdbs, 1)
	checkSelector(t, m.file+": PodDisruptionBudget", m.pdbs[0].Spec.Selector, d.Spec.Template.Metadata.Labels)

	require.Len(t, m.services, 1)
	svc := m.services[0]
	for k, v := range svc.Spec.Selector {
		require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "Service selector %s", k)
	}
	require.Equal(t, adminPort, svc.Spec.Ports[0].Port)
	require.Equal(t, "admin", svc.Spec.Ports[0].TargetPort)
	require.Equal(t, adminPort, relay.port("admin"))

	require.Len(t, m.serviceAccounts, 1)
	require.Equal(t, m.serviceAccounts[0].Metadata.Name, d.Spec.Template.Spec.ServiceAccountName)

	// The dead letters (payloads and headers) are served to no one
	// without a token unless the values say console.openPayloads.
	_, open := env.flag("admin-open-payloads")
	require.False(t, open, "%s serves the dead letters without a token", where)

	if !full {
		sink, ok := env.flag("sink")
		require.True(t, ok, "the default values name a sink")
		sinkHosts(t, where, sink)
		require.Empty(t, m.serviceMonitors)
		require.Empty(t, m.prometheusRules)
		require.Empty(t, m.configMaps)
		return
	}

	// Relay options from values reach the process by their flag names.
	for flag, want := range map[string]string{"workers": "4", "max-attempts": "30", "retry-max": "10m", "format": "cloudevents", "drain-timeout": "1m", "schema": "orders_outbox"} {
		got, ok := env.flag(flag)
		require.True(t, ok, "--%s not set", flag)
		require.Equal(t, want, got, "--%s", flag)
	}
	// The console's token file: a Secret mounted 0440, readable through
	// the pod's fsGroup (the relay refuses a token file others can read).
	tokens, ok := env.flag("admin-token-file")
	require.True(t, ok, "--admin-token-file not set")
	require.Equal(t, "/var/run/secrets/outbox-relay/console/tokens", tokens)
	readToken, _ := env.flag("admin-read-token")
	require.Equal(t, "true", readToken)
	var tokenVolume bool
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "orders-outbox-console" {
			tokenVolume = true
			require.NotNil(t, v.Secret.DefaultMode)
			require.Equal(t, 0o440, *v.Secret.DefaultMode)
		}
	}
	require.True(t, tokenVolume, "the token Secret is mounted")
	require.NotNil(t, d.Spec.Template.Spec.SecurityContext.FSGroup)
	require.EqualValues(t, 65532, *d.Spec.Template.Spec.SecurityContext.FSGroup)
	require.Equal(t, 4, *d.Spec.Replicas)
	require.Equal(t, int64(85), *d.Spec.Template.Spec.TerminationGracePeriodSeconds, "drain timeout 1m + 25s")
	require.Equal(t, "orders-outbox-owner", j.Spec.Template.Spec.Volumes[0].Secret.SecretName, "the migration runs as the schema owner")

	require.Len(t, m.serviceMonitors, 1)
	sm := m.serviceMonitors[0]
	for k, v := range sm.Spec.Selector.MatchLabels {
		require.Equal(t, v, svc.Metadata.Labels[k], "ServiceMonitor selector %s does not match the Service", k)
	}
	require.Equal(t, "admin", sm.Spec.Endpoints[0].Port)
	require.Equal(t, "kube-prometheus", sm.Metadata.Labels["release"])

	require.Len(t, m.prometheusRules, 1)
	var rules struct {
		Groups []map[string]any `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, "deploy/prometheus/alerts.yaml"), &rules))
	require.Equal(t, rules.Groups, m.prometheusRules[0].Spec.Groups, "the PrometheusRule holds the project's alert rules unchanged")

	// The rendered relay configuration is one the relay accepts: it fails
	// only on the (unreachable) database, after every check of the file.
	require.Len(t, m.configMaps, 1)
	cfg := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(m.configMaps[0].Data["relay.yaml"]), 0o600))
	cmd := exec.Command(relaybin.Binary(t), "run", "--config", cfg, "--database-url", "postgres://x@127.0.0.1:1/d?sslmode=bogus")
	cmd.Env = append(os.Environ(), "OUTBOX_CONFIG=")
	out, _ := cmd.CombinedOutput()
	require.Contains(t, string(out), "database-url: cannot parse", "the chart's config was refused:\n%s", out)
}
