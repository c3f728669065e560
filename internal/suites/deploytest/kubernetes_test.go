package deploytest

import (
	"bytes"
	"errors"
	"io"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// The types below model the subset of the Kubernetes API the manifests in
// deploy/kubernetes use, with the API's field names. They are decoded
// strictly: a field missing here is either a typo in a manifest or a new
// field to add to these types.

type k8sMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type k8sDeployment struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Strategy *struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				MaxSurge       any `yaml:"maxSurge"`
				MaxUnavailable any `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		Template podTemplate `yaml:"template"`
	} `yaml:"spec"`
}

type k8sJob struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		BackoffLimit            *int        `yaml:"backoffLimit"`
		TTLSecondsAfterFinished *int        `yaml:"ttlSecondsAfterFinished"`
		Template                podTemplate `yaml:"template"`
	} `yaml:"spec"`
}

type k8sPDB struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		MaxUnavailable any           `yaml:"maxUnavailable"`
		MinAvailable   any           `yaml:"minAvailable"`
		Selector       labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

type podTemplate struct {
	Metadata k8sMeta `yaml:"metadata"`
	Spec     podSpec `yaml:"spec"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int64               `yaml:"terminationGracePeriodSeconds"`
	AutomountServiceAccountToken  *bool                `yaml:"automountServiceAccountToken"`
	ServiceAccountName            string               `yaml:"serviceAccountName"`
	RestartPolicy                 string               `yaml:"restartPolicy"`
	SecurityContext               *podSecurityContext  `yaml:"securityContext"`
	TopologySpreadConstraints     []topologyConstraint `yaml:"topologySpreadConstraints"`
	InitContainers                []container          `yaml:"initContainers"`
	Containers                    []container          `yaml:"containers"`
	Volumes                       []volume             `yaml:"volumes"`
	NodeSelector                  map[string]string    `yaml:"nodeSelector"`
	Tolerations                   []struct {
		Key      string `yaml:"key"`
		Operator string `yaml:"operator"`
		Value    string `yaml:"value"`
		Effect   string `yaml:"effect"`
	} `yaml:"tolerations"`
	Affinity          map[string]any          `yaml:"affinity"`
	PriorityClassName string                  `yaml:"priorityClassName"`
	ImagePullSecrets  []struct{ Name string } `yaml:"imagePullSecrets"`
}

type topologyConstraint struct {
	MaxSkew           int           `yaml:"maxSkew"`
	TopologyKey       string        `yaml:"topologyKey"`
	WhenUnsatisfiable string        `yaml:"whenUnsatisfiable"`
	LabelSelector     labelSelector `yaml:"labelSelector"`
}

type seccompProfile struct {
	Type string `yaml:"type"`
}

type podSecurityContext struct {
	RunAsNonRoot   *bool           `yaml:"runAsNonRoot"`
	RunAsUser      *int64          `yaml:"runAsUser"`
	RunAsGroup     *int64          `yaml:"runAsGroup"`
	FSGroup        *int64          `yaml:"fsGroup"`
	SeccompProfile *seccompProfile `yaml:"seccompProfile"`
}

type securityContext struct {
	RunAsNonRoot             *bool           `yaml:"runAsNonRoot"`
	RunAsUser                *int64          `yaml:"runAsUser"`
	RunAsGroup               *int64          `yaml:"runAsGroup"`
	AllowPrivilegeEscalation *bool           `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool           `yaml:"readOnlyRootFilesystem"`
	Privileged               *bool           `yaml:"privileged"`
	SeccompProfile           *seccompProfile `yaml:"seccompProfile"`
	Capabilities             *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	ImagePullPolicy string   `yaml:"imagePullPolicy"`
	Command         []string `yaml:"command"`
	Args            []string `yaml:"args"`
	RestartPolicy   string   `yaml:"restartPolicy"`
	Env             []envVar `yaml:"env"`
	Ports           []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
		Protocol      string `yaml:"protocol"`
	} `yaml:"ports"`
	StartupProbe   *probe `yaml:"startupProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
	SecurityContext *securityContext `yaml:"securityContext"`
}

type envVar struct {
	Name      string  `yaml:"name"`
	Value     *string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name     string `yaml:"name"`
			Key      string `yaml:"key"`
			Optional *bool  `yaml:"optional"`
		} `yaml:"secretKeyRef"`
		ConfigMapKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"configMapKeyRef"`
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		ResourceFieldRef *struct {
			ContainerName string `yaml:"containerName"`
			Resource      string `yaml:"resource"`
			Divisor       string `yaml:"divisor"`
		} `yaml:"resourceFieldRef"`
	} `yaml:"valueFrom"`
}

type probe struct {
	HTTPGet *struct {
		Path   string `yaml:"path"`
		Port   any    `yaml:"port"` // number or container port name
		Scheme string `yaml:"scheme"`
	} `yaml:"httpGet"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	TimeoutSeconds      int `yaml:"timeoutSeconds"`
	SuccessThreshold    int `yaml:"successThreshold"`
	FailureThreshold    int `yaml:"failureThreshold"`
}

type volume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName  string `yaml:"secretName"`
		DefaultMode *int   `yaml:"defaultMode"`
		Items       []struct {
			Key  string `yaml:"key"`
			Path string `yaml:"path"`
			Mode *int   `yaml:"mode"`
		} `yaml:"items"`
	} `yaml:"secret"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	EmptyDir *struct {
		Medium    string `yaml:"medium"`
		SizeLimit string `yaml:"sizeLimit"`
	} `yaml:"emptyDir"`
}

// manifests holds the decoded documents of one file.
type manifests struct {
	file        string
	deployments []k8sDeployment
	jobs        []k8sJob
	pdbs        []k8sPDB
	// The kinds the Helm chart adds (helm_test.go).
	services        []k8sService
	serviceAccounts []k8sServiceAccount
	configMaps      []k8sConfigMap
	serviceMonitors []k8sServiceMonitor
	prometheusRules []k8sPrometheusRule
	scaledObjects   []k8sScaledObject
	hpas            []k8sHPA
}

var apiVersions = map[string]string{
	"Deployment": "apps/v1", "Job": "batch/v1", "PodDisruptionBudget": "policy/v1",
	"Service": "v1", "ServiceAccount": "v1", "ConfigMap": "v1",
	"ServiceMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
	"ScaledObject": "keda.sh/v1alpha1", "HorizontalPodAutoscaler": "autoscaling/v2",
}

func loadManifests(t *testing.T, rel string) manifests {
	t.Helper()
	return parseManifests(t, rel, readFile(t, rel))
}

// parseManifests decodes the YAML documents of data (named rel in errors)
// strictly into the types above.
func parseManifests(t *testing.T, rel string, data []byte) manifests {
	t.Helper()
	m := manifests{file: rel}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if len(doc.Content) == 0 {
			continue
		}
		var head struct {
			APIVersion string  `yaml:"apiVersion"`
			Kind       string  `yaml:"kind"`
			Metadata   k8sMeta `yaml:"metadata"`
		}
		if err := doc.Decode(&head); err != nil {
			t.Fatalf("%s line %d: %v", rel, doc.Line, err)
		}
		if want, ok := apiVersions[head.Kind]; !ok {
			t.Fatalf("%s line %d: kind %q is not modelled by this test; add it", rel, doc.Line, head.Kind)
		} else if head.APIVersion != want {
			t.Errorf("%s: %s %s: apiVersion %q, want %q", rel, head.Kind, head.Metadata.Name, head.APIVersion, want)
		}
		if head.Metadata.Name == "" {
			t.Errorf("%s line %d: %s without metadata.name", rel, doc.Line, head.Kind)
		}
		var err2 error
		switch head.Kind {
		case "Deployment":
			var d k8sDeployment
			err2 = decodeStrict(&doc, &d)
			m.deployments = append(m.deployments, d)
		case "Job":
			var j k8sJob
			err2 = decodeStrict(&doc, &j)
			m.jobs = append(m.jobs, j)
		case "PodDisruptionBudget":
			var p k8sPDB
			err2 = decodeStrict(&doc, &p)
			m.pdbs = append(m.pdbs, p)
		default:
			err2 = m.decodeMore(head.Kind, &doc)
		}
		if err2 != nil {
			t.Fatalf("%s: %s %s: %v", rel, head.Kind, head.Metadata.Name, err2)
		}
	}
	return m
}

func isRelayImage(c container) bool {
	repo, _, _ := strings.Cut(path.Base(c.Image), ":")
	return repo == "outbox-relay"
}

// cliArgs are the arguments outbox-relay gets: the subcommand first (the
// image's CMD is run).
func cliArgs(c container) []string {
	args := slices.Concat(c.Command, c.Args)
	if len(args) > 0 && strings.HasSuffix(args[0], "/outbox-relay") {
		args = args[1:]
	}
	if len(args) == 0 {
		return []string{"run"}
	}
	return args
}

func subcommand(c container) string { return cliArgs(c)[0] }

func (c container) settings() relaySettings {
	s := relaySettings{args: cliArgs(c)[1:], env: map[string]string{}}
	for _, e := range c.Env {
		if e.Value != nil {
			s.env[e.Name] = *e.Value
		}
	}
	return s
}

func (c container) env(name string) (envVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return envVar{}, false
}

// port resolves a probe's port (a number or a container port name).
func (c container) port(p any) int {
	switch v := p.(type) {
	case int:
		return v
	case string:
		for _, cp := range c.Ports {
			if cp.Name == v {
				return cp.ContainerPort
			}
		}
	}
	return -1
}

// checkPod applies the rules every pod running outbox-relay must follow.
// It returns the relay containers that run `run`.
func checkPod(t *testing.T, where string, spec podSpec) []container {
	t.Helper()
	var runs []container
	all := append(slices.Clone(spec.InitContainers), spec.Containers...)
	for _, c := range all {
		if !isRelayImage(c) {
			continue
		}
		at := where + " container " + c.Name
		checkSecurity(t, at, spec, c)
		checkDatabaseSecret(t, at, spec, c)
		checkSecretFileModes(t, at, spec, c)
		switch sub := subcommand(c); sub {
		case "run":
			runs = append(runs, c)
			checkRelayContainer(t, at, c)
		case "migrate":
		default:
			t.Errorf("%s runs outbox-relay %s; the examples run only run and migrate", at, sub)
		}
	}
	for _, c := range runs {
		drain := c.settings().drainTimeout(t)
		grace := int64(30) // the Kubernetes default
		if spec.TerminationGracePeriodSeconds != nil {
			grace = *spec.TerminationGracePeriodSeconds
		}
		if time.Duration(grace)*time.Second <= drain+afterDrain {
			t.Errorf("%s: terminationGracePeriodSeconds %d must exceed the relay's drain timeout %s plus %s for closing the admin listener and the sink, or the kubelet kills it mid-drain",
				where, grace, drain, afterDrain)
		}
	}
	return runs
}

func checkSecurity(t *testing.T, at string, spec podSpec, c container) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil {
		psc = &podSecurityContext{}
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("%s: no securityContext", at)
		sc = &securityContext{}
	}
	nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
	if !nonRoot {
		t.Errorf("%s: runAsNonRoot is not true (container or pod securityContext)", at)
	}
	for _, uid := range []*int64{sc.RunAsUser, psc.RunAsUser} {
		if uid != nil && *uid == 0 {
			t.Errorf("%s: runAsUser 0", at)
		}
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: readOnlyRootFilesystem is not true", at)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", at)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: privileged", at)
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s: capabilities must drop ALL and add none", at)
	}
	if _, ok := c.Resources.Limits["memory"]; !ok {
		t.Errorf("%s: no memory limit", at)
	}
	if len(c.Resources.Requests) == 0 {
		t.Errorf("%s: no resource requests", at)
	}
}

// checkDatabaseSecret: the database URL holds a password, so it comes from
// a Secret, as an env var (secretKeyRef) or a mounted file (_FILE).
func checkDatabaseSecret(t *testing.T, at string, spec podSpec, c container) {
	t.Helper()
	found := false
	for _, name := range []string{"OUTBOX_DATABASE_URL", "DATABASE_URL"} {
		if e, ok := c.env(name); ok {
			found = true
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s: %s must come from a Secret (valueFrom.secretKeyRef), not a literal", at, name)
			}
		}
		e, ok := c.env(name + "_FILE")
		if !ok {
			continue
		}
		found = true
		if e.Value == nil {
			t.Errorf("%s: %s_FILE has no value", at, name)
			continue
		}
		file := *e.Value
		fromSecret := false
		for _, vm := range c.VolumeMounts {
			rel, err := filepath.Rel(vm.MountPath, file)
			if err != nil || strings.HasPrefix(rel, "..") || vm.SubPath != "" {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Name != vm.Name || v.Secret == nil {
					continue
				}
				if len(v.Secret.Items) == 0 {
					fromSecret = true
				}
				for _, it := range v.Secret.Items {
					fromSecret = fromSecret || it.Path == rel
				}
			}
		}
		if !fromSecret {
			t.Errorf("%s: %s_FILE=%s is not a file of a mounted Secret volume", at, name, file)
		}
	}
	if _, config := c.settings().flag("config"); !found && !config {
		// With a config file, its sources list may name the databases
		// instead (checkChartSources checks the chart's).
		t.Errorf("%s: no OUTBOX_DATABASE_URL(_FILE) or DATABASE_URL(_FILE)", at)
	}
}

// secretFile reports whether file is a file of a Secret volume mounted
// in c, and the Secret's name and the file's mode (Kubernetes' 0644
// unless the volume or its item sets one).
func secretFile(spec podSpec, c container, file string) (secret string, mode int, ok bool) {
	for _, vm := range c.VolumeMounts {
		rel, err := filepath.Rel(vm.MountPath, file)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			mode = 0o644
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
			if len(v.Secret.Items) == 0 {
				return v.Secret.SecretName, mode, true
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					if it.Mode != nil {
						mode = *it.Mode
					}
					return v.Secret.SecretName, mode, true
				}
			}
		}
	}
	return "", 0, false
}

// checkSecretFileModes holds every *_FILE the relay reads from a mounted
// Secret to what the relay's own check accepts without its "secret file is
// readable by other users" warning (internal/app/cli: not world-readable, and
// group-readable only by a group the process is in). Kubernetes mounts
// Secret files as root, group fsGroup, mode defaultMode (0644 when unset):
// so the mode must not be world-readable, a group-readable mode needs the
// pod's fsGroup, and an owner-only mode leaves the non-root relay unable to
// read its own secret.
func checkSecretFileModes(t *testing.T, at string, spec podSpec, c container) {
	t.Helper()
	for _, e := range c.Env {
		if !strings.HasSuffix(e.Name, "_FILE") || e.Value == nil {
			continue
		}
		if _, mode, ok := secretFile(spec, c, *e.Value); ok {
			checkSecretMode(t, at, spec, e.Name+"="+*e.Value, mode)
		}
	}
}

// checkSecretMode holds the mode of a file mounted from a Secret (what
// names it) to what the relay reads without warning: see
// checkSecretFileModes.
func checkSecretMode(t *testing.T, at string, spec podSpec, what string, mode int) {
	t.Helper()
	switch {
	case mode&0o004 != 0:
		t.Errorf("%s: %s is mounted with mode %#o, readable by every user (the relay warns): set the Secret volume's defaultMode to 0440 and the pod's fsGroup", at, what, mode)
	case mode&0o040 != 0 && (spec.SecurityContext == nil || spec.SecurityContext.FSGroup == nil):
		t.Errorf("%s: %s is group-readable (mode %#o) but the pod sets no fsGroup: the file's group is not the relay's (the relay warns)", at, what, mode)
	case mode&0o044 == 0:
		t.Errorf("%s: %s has mode %#o: Secret files belong to root, so the non-root relay cannot read it; use 0440 with the pod's fsGroup", at, what, mode)
	}
}

func checkRelayContainer(t *testing.T, at string, c container) {
	t.Helper()
	set := c.settings()
	if addr, ok := set.flag("admin-addr"); ok && !strings.HasSuffix(addr, ":"+strconv.Itoa(adminPort)) {
		t.Errorf("%s: admin-addr %s; the probes use port %d", at, addr, adminPort)
	}
	for _, p := range []struct {
		kind  string
		probe *probe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/livez"}} {
		switch {
		case p.probe == nil || p.probe.HTTPGet == nil:
			t.Errorf("%s: no %s httpGet %s", at, p.kind, p.path)
		case p.probe.HTTPGet.Path != p.path || c.port(p.probe.HTTPGet.Port) != adminPort:
			t.Errorf("%s: %s is GET %s on port %v, want %s on %d", at, p.kind, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port, p.path, adminPort)
		}
	}
	if sink, ok := set.flag("sink"); ok {
		sinkHosts(t, at, sink)
	} else if _, ok := c.env("OUTBOX_SINK"); !ok {
		_, file := c.env("OUTBOX_SINK_FILE")
		_, config := c.env("OUTBOX_CONFIG")
		if !file && !config {
			t.Errorf("%s: no --sink, OUTBOX_SINK, OUTBOX_SINK_FILE or OUTBOX_CONFIG (routes)", at)
		}
	}
}

func checkSelector(t *testing.T, where string, sel labelSelector, labels map[string]string) {
	t.Helper()
	if len(sel.MatchLabels) == 0 {
		t.Errorf("%s: empty selector", where)
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			t.Errorf("%s: selector %s=%s does not match the pod template's labels", where, k, v)
		}
	}
}

// checkRolloutEnds checks that an update of the relays' Deployment that
// changes a route ends. Its new relays wait, not ready, until no old relay
// of the route is left, and the Deployment controller removes an old pod
// only while more than replicas − maxUnavailable pods are ready: the
// strategy must let it remove every old relay while no new one is ready
// (Recreate, or a maxUnavailable covering every replica), unless the
// relays share the route during the change (--on-config-change allow).
// relay/rollout_test.go drives real relays under these strategies.
func checkRolloutEnds(t *testing.T, where string, d k8sDeployment, s relaySettings) {
	t.Helper()
	if v, _ := s.flag("on-config-change"); v == "allow" {
		return
	}
	st := d.Spec.Strategy
	if st == nil || st.Type == "" || st.Type == "RollingUpdate" && st.RollingUpdate == nil {
		t.Errorf("%s: the default strategy (maxUnavailable 25%%) never ends an update that changes a route; set maxUnavailable: 100%%", where)
		return
	}
	if st.Type == "Recreate" {
		return
	}
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	unavailable := 0
	switch v := st.RollingUpdate.MaxUnavailable.(type) {
	case int:
		unavailable = v
	case string:
		pct, err := strconv.Atoi(strings.TrimSuffix(v, "%"))
		if err != nil || !strings.HasSuffix(v, "%") {
			t.Errorf("%s: maxUnavailable %q is neither a number nor a percentage", where, v)
			return
		}
		unavailable = pct * replicas / 100 // the controller rounds down
	}
	if unavailable < replicas {
		t.Errorf("%s: maxUnavailable %v of %d replicas: an update that changes a route never ends (its last old relays stay while the new ones wait); set maxUnavailable: 100%%",
			where, st.RollingUpdate.MaxUnavailable, replicas)
	}
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(root(t), "deploy", "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/kubernetes/*.yaml (%v)", err)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(root(t), f)
		m := loadManifests(t, rel)
		for _, d := range m.deployments {
			where := rel + ": Deployment " + d.Metadata.Name
			checkSelector(t, where, d.Spec.Selector, d.Spec.Template.Metadata.Labels)
			checkPod(t, where, d.Spec.Template.Spec)
		}
		for _, j := range m.jobs {
			where := rel + ": Job " + j.Metadata.Name
			if p := j.Spec.Template.Spec.RestartPolicy; p != "OnFailure" && p != "Never" {
				t.Errorf("%s: restartPolicy %q, want OnFailure or Never", where, p)
			}
			if runs := checkPod(t, where, j.Spec.Template.Spec); len(runs) > 0 {
				t.Errorf("%s runs a relay; relays belong in Deployments (or as sidecars)", where)
			}
		}
	}
}

func TestKubernetesSidecar(t *testing.T) {
	t.Parallel()
	m := loadManifests(t, "deploy/kubernetes/sidecar.yaml")
	if len(m.deployments) != 1 {
		t.Fatalf("%s: want one Deployment, found %d", m.file, len(m.deployments))
	}
	d := m.deployments[0]
	spec := d.Spec.Template.Spec
	where := m.file + ": Deployment " + d.Metadata.Name

	sidecar := -1
	for i, c := range spec.InitContainers {
		if !isRelayImage(c) {
			continue
		}
		switch subcommand(c) {
		case "run":
			if c.RestartPolicy != "Always" {
				t.Errorf("%s: init container %s runs the relay without restartPolicy: Always; it would block the app forever", where, c.Name)
			}
			sidecar = i
		case "migrate":
			if c.RestartPolicy != "" {
				t.Errorf("%s: init container %s (migrate) must run to completion: no restartPolicy", where, c.Name)
			}
			if sidecar >= 0 {
				t.Errorf("%s: init container %s (migrate) comes after the relay; the relay needs the schema", where, c.Name)
			}
		}
	}
	if sidecar < 0 {
		t.Fatalf("%s: no native sidecar (an initContainers entry running outbox-relay run with restartPolicy: Always)", where)
	}
	// The app starts only once the sidecar is started: that needs a
	// startupProbe, or the app may write before the relay is up (harmless)
	// and, worse, stop after it (see docs/deploy.md).
	if c := spec.InitContainers[sidecar]; c.StartupProbe == nil || c.StartupProbe.HTTPGet == nil || c.port(c.StartupProbe.HTTPGet.Port) != adminPort {
		t.Errorf("%s: sidecar %s has no startupProbe on the admin port", where, c.Name)
	}
	apps := 0
	for _, c := range spec.Containers {
		if isRelayImage(c) && subcommand(c) == "run" {
			t.Errorf("%s: container %s runs the relay as an ordinary container; use the native sidecar", where, c.Name)
		}
		if !isRelayImage(c) {
			apps++
		}
	}
	if apps == 0 {
		t.Errorf("%s: no application container next to the sidecar", where)
	}
}

func TestKubernetesStandalone(t *testing.T) {
	t.Parallel()
	m := loadManifests(t, "deploy/kubernetes/deployment.yaml")
	var relays *k8sDeployment
	for i, d := range m.deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			if isRelayImage(c) && subcommand(c) == "run" {
				relays = &m.deployments[i]
			}
		}
	}
	if relays == nil {
		t.Fatalf("%s: no Deployment runs outbox-relay run", m.file)
	}
	for _, c := range relays.Spec.Template.Spec.Containers {
		if isRelayImage(c) && subcommand(c) == "run" {
			checkRolloutEnds(t, m.file+": Deployment "+relays.Metadata.Name, *relays, c.settings())
		}
	}
	replicas := 1
	if relays.Spec.Replicas != nil {
		replicas = *relays.Spec.Replicas
	}
	if replicas < 2 {
		t.Errorf("%s: Deployment %s has %d replica(s); the example shows several relays sharing the lanes", m.file, relays.Metadata.Name, replicas)
	}

	migrates := false
	for _, j := range m.jobs {
		for _, c := range j.Spec.Template.Spec.Containers {
			migrates = migrates || (isRelayImage(c) && subcommand(c) == "migrate")
		}
	}
	if !migrates {
		t.Errorf("%s: no Job runs outbox-relay migrate", m.file)
	}

	covered := false
	for _, p := range m.pdbs {
		where := m.file + ": PodDisruptionBudget " + p.Metadata.Name
		checkSelector(t, where, p.Spec.Selector, relays.Spec.Template.Metadata.Labels)
		covered = true
		if (p.Spec.MaxUnavailable == nil) == (p.Spec.MinAvailable == nil) {
			t.Errorf("%s: set exactly one of maxUnavailable and minAvailable", where)
		}
		// A budget that allows no disruption blocks every node drain.
		if n, ok := p.Spec.MinAvailable.(int); ok && n >= replicas {
			t.Errorf("%s: minAvailable %d with %d replicas allows no disruption", where, n, replicas)
		}
		if n, ok := p.Spec.MaxUnavailable.(int); ok && n < 1 {
			t.Errorf("%s: maxUnavailable %d allows no disruption", where, n)
		}
	}
	if !covered {
		t.Errorf("%s: no PodDisruptionBudget for the relays", m.file)
	}
}
