package deploytest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
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

// scaleTarget is the scaleTargetRef of a ScaledObject or a
// HorizontalPodAutoscaler.
type scaleTarget struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Name       string `yaml:"name"`
}

type k8sScaledObject struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		ScaleTargetRef  scaleTarget `yaml:"scaleTargetRef"`
		PollingInterval *int        `yaml:"pollingInterval"`
		CooldownPeriod  *int        `yaml:"cooldownPeriod"`
		MinReplicaCount *int        `yaml:"minReplicaCount"`
		MaxReplicaCount *int        `yaml:"maxReplicaCount"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig struct {
				Behavior map[string]any `yaml:"behavior"`
			} `yaml:"horizontalPodAutoscalerConfig"`
		} `yaml:"advanced"`
		Triggers []struct {
			Type       string `yaml:"type"`
			MetricType string `yaml:"metricType"`
			// any, not string: KEDA takes strings only, which the test
			// checks rather than letting the decoder convert.
			Metadata          map[string]any `yaml:"metadata"`
			AuthenticationRef *struct {
				Name string `yaml:"name"`
			} `yaml:"authenticationRef"`
		} `yaml:"triggers"`
	} `yaml:"spec"`
}

type metricTarget struct {
	Type               string `yaml:"type"`
	AverageValue       any    `yaml:"averageValue"`
	AverageUtilization *int   `yaml:"averageUtilization"`
}

type k8sHPA struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		ScaleTargetRef scaleTarget `yaml:"scaleTargetRef"`
		MinReplicas    *int        `yaml:"minReplicas"`
		MaxReplicas    int         `yaml:"maxReplicas"`
		Metrics        []struct {
			Type     string `yaml:"type"`
			External *struct {
				Metric struct {
					Name     string        `yaml:"name"`
					Selector labelSelector `yaml:"selector"`
				} `yaml:"metric"`
				Target metricTarget `yaml:"target"`
			} `yaml:"external"`
			Resource *struct {
				Name   string       `yaml:"name"`
				Target metricTarget `yaml:"target"`
			} `yaml:"resource"`
		} `yaml:"metrics"`
		Behavior map[string]any `yaml:"behavior"`
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
	case "ScaledObject":
		var v k8sScaledObject
		err = decodeStrict(doc, &v)
		m.scaledObjects = append(m.scaledObjects, v)
	case "HorizontalPodAutoscaler":
		var v k8sHPA
		err = decodeStrict(doc, &v)
		m.hpas = append(m.hpas, v)
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
	helm(t, "lint", "--strict", chartDir, "-f", chartDir+"/ci/keda-values.yaml")
	helm(t, "lint", "--strict", chartDir, "-f", chartDir+"/ci/hpa-values.yaml")
	helm(t, "lint", "--strict", chartDir, "-f", chartDir+"/ci/sources-values.yaml")
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
		sources bool
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
		// Many databases: a sources list, each source's URL from its own
		// Secret, and no database URL.
		{name: "sources", values: []string{"--kube-version", "1.29.0", "-f", chartDir + "/ci/sources-values.yaml"}, sources: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := helm(t, append([]string{"template", "relay", chartDir, "--namespace", "apps"}, tc.values...)...)
			m := parseManifests(t, "helm template "+tc.name, out)
			if tc.secrets {
				checkChartSecrets(t, m)
				return
			}
			if tc.sources {
				checkChartSources(t, m)
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

// checkChartSources checks a rendering of ci/sources-values.yaml: the
// config file holds the sources list, in the relays' ConfigMap and in a
// hook copy the migration reads (the hook Job runs before the release's
// own objects exist); no database URL is set (the relay refuses one
// beside the list); each source's database-url-file is a file of a Secret
// mounted in both pods (the migration's own for tenant-b) that the relay
// reads without warning. Then the relay binary runs as each container
// would, the files in temporary places and the databases unreachable:
// run starts relaying from both sources, and migrate tries both.
func checkChartSources(t *testing.T, m manifests) {
	require.Len(t, m.deployments, 1, "one Deployment")
	spec := m.deployments[0].Spec.Template.Spec
	runs := checkPod(t, m.file+": Deployment", spec)
	require.Len(t, runs, 1)
	relay := runs[0]
	require.Len(t, m.jobs, 1, "the migration hook Job")
	job := m.jobs[0]
	checkPod(t, m.file+": Job", job.Spec.Template.Spec)
	migrate := job.Spec.Template.Spec.Containers[0]
	require.Equal(t, "migrate", subcommand(migrate))
	for _, c := range []container{relay, migrate} {
		for _, env := range []string{"OUTBOX_DATABASE_URL", "OUTBOX_DATABASE_URL_FILE", "DATABASE_URL", "DATABASE_URL_FILE"} {
			_, ok := c.env(env)
			require.False(t, ok, "container %s sets %s beside the sources list, which the relay refuses", c.Name, env)
		}
	}

	cms := map[string]k8sConfigMap{}
	for _, cm := range m.configMaps {
		cms[cm.Metadata.Name] = cm
	}
	require.Len(t, cms, 2, "the relays' config file and the migration's copy")
	hook := cms[chartRelease+"-migrate"]
	require.Equal(t, job.Metadata.Annotations["helm.sh/hook"], hook.Metadata.Annotations["helm.sh/hook"], "the migration's config file is a hook of the Job's")
	cmWeight, _ := strconv.Atoi(hook.Metadata.Annotations["helm.sh/hook-weight"])
	jobWeight, _ := strconv.Atoi(job.Metadata.Annotations["helm.sh/hook-weight"])
	require.Less(t, cmWeight, jobWeight, "the config file is created before the Job")
	require.Equal(t, cms[chartRelease].Data, hook.Data)
	configs := map[string]string{"relay": chartRelease, "migrate": chartRelease + "-migrate"}
	var file map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(cms[chartRelease].Data["relay.yaml"]), &file))
	list, _ := file["sources"].([]any)
	require.Len(t, list, 2, "the config file's sources")

	// Each source's URL file, then as the pod would read it: an
	// unreachable database of the source's name.
	dir := t.TempDir()
	local := map[string]string{}
	want := map[string][]string{"relay": {"tenant-a-db", "tenant-b-db"}, "migrate": {"tenant-a-db", "tenant-b-db-owner"}}
	for i, entry := range list {
		src, _ := entry.(map[string]any)
		name, _ := src["name"].(string)
		path, _ := src["database-url-file"].(string)
		require.NotEmpty(t, path, "source %s has no database-url-file", name)
		for _, pod := range []struct {
			name string
			spec podSpec
			c    container
		}{{"relay", spec, relay}, {"migrate", job.Spec.Template.Spec, migrate}} {
			secret, mode, ok := secretFile(pod.spec, pod.c, path)
			require.True(t, ok, "%s: source %s's database-url-file %s is not a file of a mounted Secret", pod.name, name, path)
			require.Equal(t, want[pod.name][i], secret, "%s: source %s", pod.name, name)
			checkSecretMode(t, m.file+": "+pod.name, pod.spec, "source "+name+"'s database-url-file "+path, mode)
		}
		local[path] = filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(local[path], []byte("postgres://relay@127.0.0.1:1/"+name+"\n"), 0o600))
		src["database-url-file"] = local[path]
	}
	b, err := yaml.Marshal(file)
	require.NoError(t, err)
	localCfg := filepath.Join(dir, "relay.yaml")
	require.NoError(t, os.WriteFile(localCfg, b, 0o600))

	for _, tc := range []struct {
		name string
		spec podSpec
		c    container
	}{{"relay", spec, relay}, {"migrate", job.Spec.Template.Spec, migrate}} {
		s := tc.c.settings()
		path, ok := s.flag("config")
		require.True(t, ok, "%s reads no config file", tc.name)
		require.Equal(t, configs[tc.name], configMapOf(tc.spec, tc.c, path), "%s: --config %s is not a file of its ConfigMap", tc.name, path)
		args := slices.Clone(s.args)
		for i, a := range args {
			args[i] = strings.ReplaceAll(a, path, localCfg)
		}
		env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "OUTBOX_") || strings.HasPrefix(kv, "DATABASE_URL")
		})
		for k, v := range s.env {
			switch k {
			case "OUTBOX_CONFIG":
				v = localCfg
			case "OUTBOX_ADMIN_ADDR":
				v = "127.0.0.1:0"
			}
			env = append(env, k+"="+v)
		}
		cmd := exec.Command(relaybin.Binary(t), append([]string{subcommand(tc.c)}, args...)...)
		cmd.Env = env
		if tc.name == "migrate" {
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "migrate:\n%s", out)
			require.Equal(t, 1, exit.ExitCode(), "migrate failed otherwise than on the databases:\n%s", out)
			for _, name := range []string{"tenant-a", "tenant-b"} {
				require.Contains(t, string(out), "source "+name+": ", "migrate did not try source %s", name)
			}
			continue
		}
		relayStarts(t, cmd, len(list))
	}
}

// relayStarts runs cmd, outbox-relay run with a sources list, until it
// logs that it starts relaying from n sources, then stops it.
func relayStarts(t *testing.T, cmd *exec.Cmd, n int) {
	t.Helper()
	var out testkit.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	started := regexp.MustCompile(fmt.Sprintf(`"msg":"starting","sources":%d\b|msg=starting sources=%d\b`, n, n))
	deadline := time.After(30 * time.Second)
	for !started.MatchString(out.String()) {
		select {
		case err := <-done:
			t.Fatalf("run exited (%v) before starting its %d sources:\n%s", err, n, out.String())
		case <-deadline:
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("run did not start its %d sources in 30s:\n%s", n, out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// configMapOf returns the name of the ConfigMap whose volume, mounted in
// c, holds file ("" when none does).
func configMapOf(spec podSpec, c container, file string) string {
	for _, vm := range c.VolumeMounts {
		rel, err := filepath.Rel(vm.MountPath, file)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				return v.ConfigMap.Name
			}
		}
	}
	return ""
}

// The chart refuses, naming the value, database URL Secrets of sources
// without a sources list or of a source the list does not have, and no
// database at all.
func TestHelmSourcesRefusals(t *testing.T) {
	t.Parallel()
	sources := []string{"-f", chartDir + "/ci/sources-values.yaml"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "database.existingSecret="}, "database.existingSecret: the Secret holding the database URL (or, with many databases, a sources list in config.sources)"},
		{[]string{"--set", "database.sourceSecrets[0].name=a", "--set", "database.sourceSecrets[0].existingSecret=a-db"}, "database.sourceSecrets[0]: mounts the database URL of a source, and config.sources lists none"},
		{append(sources, "--set", "database.sourceSecrets[1].name=tenant-c"), `database.sourceSecrets[1].name: "tenant-c" is not a source of config.sources (tenant-a, tenant-b)`},
		{append(sources, "--set", "migration.database.sourceSecrets[0].existingSecret="), "migration.database.sourceSecrets[0].existingSecret: the Secret holding source tenant-b's database URL"},
	} {
		out := helmFails(t, append([]string{"template", "relay", chartDir}, tc.args...)...)
		require.Contains(t, out, tc.want, "helm template %s", strings.Join(tc.args, " "))
	}
	// Without the database's Secret, the sources list suffices.
	renderChart(t, "sources, no database Secret", append(sources, "--set", "database.existingSecret=")...)
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

// helmFails runs helm, which must fail, and returns what it wrote.
func helmFails(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("helm")
	if err != nil {
		unavailable(t, "helm not found (scripts/services.sh helm builds it from its Go module)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = root(t)
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "helm %s succeeded:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// renderChart renders the chart as release "relay" in namespace "apps"
// with args added, and decodes it strictly.
func renderChart(t *testing.T, name string, args ...string) manifests {
	t.Helper()
	out := helm(t, append([]string{"template", "relay", chartDir, "--namespace", "apps", "--kube-version", "1.29.0"}, args...)...)
	return parseManifests(t, "helm template "+name, out)
}

const (
	chartRelease = "relay-outbox-relay" // the fullname of release "relay"
	kedaOn       = "keda.enabled=true"
	kedaServer   = "keda.prometheus.serverAddress=http://prometheus-operated.monitoring.svc:9090"
)

// An autoscaler's bounds, as the test expects them.
type bounds struct{ min, max int }

// The chart scales the relays with KEDA or a HorizontalPodAutoscaler
// only when asked, and then leaves the Deployment's replicas to it. The
// maximum left empty is what the lanes can use: ceil(256 / workers) for
// the route with the fewest workers.
func TestHelmAutoscaling(t *testing.T) {
	t.Parallel()
	t.Run("neither by default", func(t *testing.T) {
		t.Parallel()
		m := renderChart(t, "defaults")
		require.Empty(t, m.scaledObjects)
		require.Empty(t, m.hpas)
		require.Len(t, m.deployments, 1)
		require.NotNil(t, m.deployments[0].Spec.Replicas, "a Deployment nobody scales sets its replicas")
		require.Equal(t, 2, *m.deployments[0].Spec.Replicas)
	})
	for _, tc := range []struct {
		name string
		args []string
		want bounds
	}{
		{"keda, defaults", []string{"--set", kedaOn, "--set", kedaServer}, bounds{2, 128}},
		{"keda, 4 workers", []string{"--set", kedaOn, "--set", kedaServer, "--set", "relay.workers=4"}, bounds{2, 64}},
		{"keda, 3 workers", []string{"--set", kedaOn, "--set", kedaServer, "--set", "relay.workers=3"}, bounds{2, 86}},
		// Routes: the fewest workers of any route sets the ceiling, a
		// route without its own workers having relay.workers.
		{"keda, routes", append([]string{"--set", kedaOn, "--set", kedaServer, "--set", "relay.workers=16"}, routes(8, 32)...), bounds{2, 32}},
		{"keda, a route on relay.workers", append([]string{"--set", kedaOn, "--set", kedaServer, "--set", "relay.workers=4"}, routes(8, 0)...), bounds{2, 64}},
		{"keda, ci values", []string{"-f", chartDir + "/ci/keda-values.yaml"}, bounds{3, 24}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := renderChart(t, tc.name, tc.args...)
			checkAutoscaled(t, m)
			require.Len(t, m.scaledObjects, 1)
			require.Empty(t, m.hpas)
			checkScaledObject(t, m.scaledObjects[0], tc.want)
		})
	}
	for _, tc := range []struct {
		name string
		args []string
		want bounds
	}{
		{"hpa, defaults", []string{"--set", "hpa.enabled=true"}, bounds{2, 128}},
		{"hpa, 8 workers", []string{"--set", "hpa.enabled=true", "--set", "relay.workers=8"}, bounds{2, 32}},
		{"hpa, ci values", []string{"-f", chartDir + "/ci/hpa-values.yaml"}, bounds{2, 16}},
		{"hpa, CPU only", []string{"--set", "hpa.enabled=true", "--set", "hpa.external.metricName=", "--set", "hpa.cpuUtilization=70", "--set", "hpa.minReplicas=1", "--set", "hpa.maxReplicas=6"}, bounds{1, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := renderChart(t, tc.name, tc.args...)
			checkAutoscaled(t, m)
			require.Len(t, m.hpas, 1)
			require.Empty(t, m.scaledObjects)
			checkHPA(t, m.hpas[0], tc.name, tc.want)
		})
	}
}

// routes returns --set arguments for two routes with the given workers
// (0: the route sets none).
func routes(workers ...int) []string {
	args := []string{"--set", "sink.url="}
	for i, w := range workers {
		r := fmt.Sprintf("config.routes[%d].", i)
		args = append(args, "--set", r+"name=r"+strconv.Itoa(i), "--set", r+"topics={t"+strconv.Itoa(i)+".*}", "--set", r+"sink=kafka://kafka:9092")
		if w > 0 {
			args = append(args, "--set", r+"workers="+strconv.Itoa(w))
		}
	}
	return args
}

// checkAutoscaled checks the Deployment of an autoscaled rendering: no
// replicas (the autoscaler's), and the checks every relay pod passes.
func checkAutoscaled(t *testing.T, m manifests) {
	t.Helper()
	require.Len(t, m.deployments, 1)
	d := m.deployments[0]
	require.Nil(t, d.Spec.Replicas, "%s: the Deployment sets replicas, which the autoscaler owns", m.file)
	require.Equal(t, chartRelease, d.Metadata.Name)
	runs := checkPod(t, m.file+": Deployment", d.Spec.Template.Spec)
	require.Len(t, runs, 1)
	checkRolloutEnds(t, m.file+": Deployment", d, runs[0].settings())
	require.Len(t, m.pdbs, 1, "the disruption budget stays")
}

func checkTarget(t *testing.T, ref scaleTarget) {
	t.Helper()
	require.Equal(t, scaleTarget{APIVersion: "apps/v1", Kind: "Deployment", Name: chartRelease}, ref)
}

func checkScaledObject(t *testing.T, so k8sScaledObject, want bounds) {
	t.Helper()
	checkTarget(t, so.Spec.ScaleTargetRef)
	require.Equal(t, chartRelease, so.Metadata.Name)
	require.NotNil(t, so.Spec.MinReplicaCount, "minReplicaCount unset: KEDA's default is 0, no relay at all")
	require.NotNil(t, so.Spec.MaxReplicaCount)
	require.Equal(t, want, bounds{*so.Spec.MinReplicaCount, *so.Spec.MaxReplicaCount})
	require.NotNil(t, so.Spec.PollingInterval)
	require.NotNil(t, so.Spec.CooldownPeriod)

	require.Len(t, so.Spec.Triggers, 1)
	tr := so.Spec.Triggers[0]
	require.Equal(t, "prometheus", tr.Type)
	require.Equal(t, "AverageValue", tr.MetricType, "relays wanted: the backlog over the threshold")
	for k, v := range tr.Metadata {
		require.IsType(t, "", v, "trigger metadata %s: KEDA reads strings only", k)
	}
	require.Equal(t, "http://prometheus-operated.monitoring.svc:9090", tr.Metadata["serverAddress"])
	query, _ := tr.Metadata["query"].(string)
	require.Equal(t, chartBacklogQuery(t), query, "the default query")

	if want.min != 3 { // not ci/keda-values.yaml
		require.Equal(t, "5000", tr.Metadata["threshold"])
		require.Nil(t, so.Spec.Advanced)
		require.Nil(t, tr.AuthenticationRef)
		return
	}
	require.Equal(t, "2000", tr.Metadata["threshold"])
	require.Equal(t, "false", tr.Metadata["unsafeSsl"])
	require.Equal(t, 15, *so.Spec.PollingInterval)
	require.Equal(t, 120, *so.Spec.CooldownPeriod)
	require.NotNil(t, tr.AuthenticationRef)
	require.Equal(t, "prometheus-credentials", tr.AuthenticationRef.Name)
	require.NotNil(t, so.Spec.Advanced)
	require.Equal(t, map[string]any{"scaleDown": map[string]any{"stabilizationWindowSeconds": 600}}, so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior)
}

func checkHPA(t *testing.T, h k8sHPA, name string, want bounds) {
	t.Helper()
	checkTarget(t, h.Spec.ScaleTargetRef)
	require.NotNil(t, h.Spec.MinReplicas, "minReplicas unset")
	require.Equal(t, want, bounds{*h.Spec.MinReplicas, h.Spec.MaxReplicas})
	var external, cpu int
	for _, m := range h.Spec.Metrics {
		switch m.Type {
		case "External":
			external++
			require.NotNil(t, m.External)
			require.Equal(t, adapterMetricName(t), m.External.Metric.Name, "the metric docs/deploy.md's adapter rule serves")
			require.Equal(t, "AverageValue", m.External.Target.Type)
			require.IsType(t, "", m.External.Target.AverageValue, "averageValue is a quantity string")
			require.Equal(t, chartRelease, m.External.Metric.Selector.MatchLabels["service"])
		case "Resource":
			cpu++
			require.NotNil(t, m.Resource)
			require.Equal(t, "cpu", m.Resource.Name)
			require.Equal(t, "Utilization", m.Resource.Target.Type)
			require.NotNil(t, m.Resource.Target.AverageUtilization)
		default:
			t.Fatalf("%s: metric type %q", name, m.Type)
		}
	}
	switch name {
	case "hpa, ci values":
		require.Equal(t, []int{1, 1}, []int{external, cpu})
		require.Equal(t, "3000", h.Spec.Metrics[0].External.Target.AverageValue)
		require.Equal(t, 80, *h.Spec.Metrics[1].Resource.Target.AverageUtilization)
		require.Equal(t, map[string]any{"scaleDown": map[string]any{"stabilizationWindowSeconds": 600}}, h.Spec.Behavior)
	case "hpa, CPU only":
		require.Equal(t, []int{0, 1}, []int{external, cpu})
	default:
		require.Equal(t, []int{1, 0}, []int{external, cpu})
		require.Equal(t, "5000", h.Spec.Metrics[0].External.Target.AverageValue)
		require.Equal(t, map[string]string{"service": chartRelease}, h.Spec.Metrics[0].External.Metric.Selector.MatchLabels)
		require.Nil(t, h.Spec.Behavior)
	}
}

// The chart refuses, naming the value, two autoscalers, fewer than one
// relay, a maximum below the minimum or beyond the lanes, a ScaledObject
// without a Prometheus and a HorizontalPodAutoscaler without a metric.
func TestHelmAutoscalingRefusals(t *testing.T) {
	t.Parallel()
	keda := []string{"--set", kedaOn, "--set", kedaServer}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(keda, "--set", "hpa.enabled=true"), "keda.enabled and hpa.enabled: enable one autoscaler"},
		// Before any other refusal: the one that says what to choose.
		{[]string{"--set", kedaOn, "--set", "hpa.enabled=true", "--set", "hpa.minReplicas=0"}, "keda.enabled and hpa.enabled: enable one autoscaler"},
		{append(keda, "--set", "keda.minReplicaCount=0"), "keda.minReplicaCount: 0: at least 1"},
		{[]string{"--set", "hpa.enabled=true", "--set", "hpa.minReplicas=0"}, "hpa.minReplicas: 0: at least 1"},
		{append(keda, "--set", "keda.minReplicaCount=two"), `keda.minReplicaCount: "two" is not a whole number`},
		{append(keda, "--set", "keda.maxReplicaCount=1"), "keda.maxReplicaCount: 1 is below keda.minReplicaCount (2)"},
		{append(keda, "--set", "keda.maxReplicaCount=257"), "keda.maxReplicaCount: 257: a route has 256 lanes"},
		{[]string{"--set", "hpa.enabled=true", "--set", "hpa.maxReplicas=300", "--set", "relay.workers=4"}, "hpa.maxReplicas: 300: a route has 256 lanes, and a relay beyond 256 holds none; with these workers relays add workers up to 64"},
		{[]string{"--set", kedaOn}, "keda.prometheus.serverAddress: the Prometheus KEDA queries"},
		{[]string{"--set", "hpa.enabled=true", "--set", "hpa.external.metricName="}, "hpa.external.metricName or hpa.cpuUtilization: the HorizontalPodAutoscaler needs a metric"},
	} {
		out := helmFails(t, append([]string{"template", "relay", chartDir}, tc.args...)...)
		require.Contains(t, out, tc.want, "helm template %s", strings.Join(tc.args, " "))
	}
	// The same values render with the bounds right.
	renderChart(t, "bounds equal", append(keda, "--set", "keda.minReplicaCount=1", "--set", "keda.maxReplicaCount=1")...)
	renderChart(t, "at the lanes", append(keda, "--set", "keda.maxReplicaCount=256")...)
}

// chartBacklogQuery is the query a ScaledObject of release "relay" in
// namespace "apps" gets by default.
func chartBacklogQuery(t *testing.T) string {
	t.Helper()
	m := renderChart(t, "backlog query", "--set", kedaOn, "--set", kedaServer)
	require.Len(t, m.scaledObjects, 1)
	q, ok := m.scaledObjects[0].Spec.Triggers[0].Metadata["query"].(string)
	require.True(t, ok, "no query")
	return q
}

// adapterRule is the prometheus-adapter rule of docs/deploy.md: the name
// it serves the backlog as, and its query.
var adapterRule = regexp.MustCompile(`(?s)externalRules:.*?as: (\S+)\n.*?metricsQuery: '([^']+)'`)

func adapterMetricName(t *testing.T) string {
	t.Helper()
	m := adapterRule.FindStringSubmatch(string(readFile(t, "docs/deploy.md")))
	require.NotNil(t, m, "docs/deploy.md has no prometheus-adapter externalRules with a name and a metricsQuery")
	return m[1]
}

// The backlog query, the chart's and the one docs/deploy.md gives
// prometheus-adapter (with the label matchers the adapter puts in for the
// chart's HorizontalPodAutoscaler), evaluated by Prometheus on made-up
// series: the largest of the relays' ready counts (pending − retrying −
// delayed, per pod), only this release's relays, 0 while a destination of
// theirs is down, and 0 with no relay reporting.
func TestHelmBacklogQuery(t *testing.T) {
	t.Parallel()
	pt := promtool(t)
	m := adapterRule.FindStringSubmatch(string(readFile(t, "docs/deploy.md")))
	require.NotNil(t, m, "docs/deploy.md has no prometheus-adapter rule")
	adapter := strings.ReplaceAll(m[2], "<<.LabelMatchers>>", `namespace="apps",service="`+chartRelease+`"`)
	for name, query := range map[string]string{"chart": chartBacklogQuery(t), "docs/deploy.md adapter rule": adapter} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "t.yaml"), backlogQueryTests(t, query), 0o600))
			cmd := exec.Command(pt, "test", "rules", "t.yaml")
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "promtool test rules on %s:\n%s", query, out)
		})
	}
}

// backlogQueryTests is a promtool rule test of query.
func backlogQueryTests(t *testing.T, query string) []byte {
	t.Helper()
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	type exprTest struct {
		Expr       string   `yaml:"expr"`
		EvalTime   string   `yaml:"eval_time"`
		ExpSamples []sample `yaml:"exp_samples"`
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type group struct {
		Interval string     `yaml:"interval"`
		Input    []series   `yaml:"input_series"`
		Tests    []exprTest `yaml:"promql_expr_test"`
	}
	gauge := func(name, ns, svc, pod, values string) series {
		return series{fmt.Sprintf(`outbox_relay_%s{namespace=%q,service=%q,pod=%q}`, name, ns, svc, pod), values}
	}
	relays := func(ns, svc, pod, pending, retrying, delayed string) []series {
		return []series{
			gauge("pending_messages", ns, svc, pod, pending),
			gauge("retrying_messages", ns, svc, pod, retrying),
			gauge("delayed_messages", ns, svc, pod, delayed),
		}
	}
	at := func(eval string, want float64) exprTest {
		return exprTest{Expr: query, EvalTime: eval, ExpSamples: []sample{{Labels: "{}", Value: want}}}
	}
	var busy []series
	// Two relays of the release, one a refresh behind the other: 850 and
	// 800 ready, then a backlog of retries and delayed messages only.
	busy = append(busy, relays("apps", chartRelease, "a", "1000 1000 1000 5000", "100 100 100 4000", "50 50 50 1000")...)
	busy = append(busy, relays("apps", chartRelease, "b", "900 900 900 5000", "100 100 100 4000", "0 0 0 1000")...)
	// Another release beside it, and this release's name in another
	// namespace: neither counts, nor does their destination.
	busy = append(busy, relays("apps", "other-outbox-relay", "c", "99999x3", "0x3", "0x3")...)
	busy = append(busy, relays("staging", chartRelease, "d", "99999x3", "0x3", "0x3")...)
	busy = append(busy, gauge("destination_down", "apps", "other-outbox-relay", "c", "1x3"),
		series{fmt.Sprintf(`outbox_relay_destination_down{namespace="apps",service=%q,pod="a",route="",sink="kafka"}`, chartRelease), "0 0 1 0"})
	file := struct {
		RuleFiles          []string `yaml:"rule_files"`
		EvaluationInterval string   `yaml:"evaluation_interval"`
		Tests              []group  `yaml:"tests"`
	}{
		RuleFiles: []string{}, EvaluationInterval: "1m",
		Tests: []group{
			{Interval: "1m", Input: busy, Tests: []exprTest{at("0m", 850), at("1m", 850), at("2m", 0), at("3m", 0)}},
			// No relay of the release reports anything.
			{Interval: "1m", Input: relays("apps", "other-outbox-relay", "c", "99999x3", "0x3", "0x3"), Tests: []exprTest{at("1m", 0)}},
		},
	}
	b, err := yaml.Marshal(file)
	require.NoError(t, err)
	return b
}
