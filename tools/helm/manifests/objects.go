package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest object.
type Object struct {
	Kind      string
	Name      string
	Namespace string
	// Labels of the object itself.
	Labels map[string]string
	// Obj is a pointer to the typed object (*appsv1.Deployment, ...).
	Obj any
}

// ID names the object in messages.
func (o Object) ID() string { return o.Kind + " " + o.Namespace + "/" + o.Name }

// newObject returns an empty typed object for an apiVersion and kind, or
// nil when planex's manifests have no business holding that kind.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/Service":
		return &corev1.Service{}
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "networking.k8s.io/v1/Ingress":
		return &networkingv1.Ingress{}
	case "keda.sh/v1alpha1/ScaledObject":
		return &ScaledObject{}
	case "monitoring.coreos.com/v1/PodMonitor":
		return &PodMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &PrometheusRule{}
	case "cert-manager.io/v1/Certificate":
		return &Certificate{}
	case "cert-manager.io/v1/Issuer":
		return &Issuer{}
	}
	return nil
}

// Decode splits a multi-document YAML stream and strictly decodes every
// object into its typed form: unknown fields, duplicate keys, type
// mismatches and unknown kinds are errors. Objects without a namespace get
// defaultNamespace (what `kubectl apply -n` / `helm install -n` would do).
func Decode(data []byte, defaultNamespace string) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []Object
	var errs []error
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i, err))
			continue
		}
		var tm struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(js, &tm); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i, err))
			continue
		}
		id := fmt.Sprintf("%s %s", tm.Kind, tm.Metadata.Name)
		obj := newObject(tm.APIVersion, tm.Kind)
		if obj == nil {
			errs = append(errs, fmt.Errorf("%s: unexpected kind %s/%s", id, tm.APIVersion, tm.Kind))
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			errs = append(errs, fmt.Errorf("%s: strict decode: %w", id, err))
			continue
		}
		ns := tm.Metadata.Namespace
		if ns == "" && tm.Kind != "Namespace" {
			ns = defaultNamespace
		}
		objs = append(objs, Object{Kind: tm.Kind, Name: tm.Metadata.Name, Namespace: ns, Labels: tm.Metadata.Labels, Obj: obj})
	}
	return objs, errors.Join(errs...)
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, l := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			out = append(out, l)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// ScaledObject is the part of KEDA's keda.sh/v1alpha1 ScaledObject that
// planex uses, decoded strictly (the KEDA module is too heavy to import for
// its types; the fields follow KEDA 2.x's ScaledObjectSpec).
type ScaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		Fallback        *struct {
			FailureThreshold int32 `json:"failureThreshold"`
			Replicas         int32 `json:"replicas"`
		} `json:"fallback,omitempty"`
		Advanced *struct {
			HorizontalPodAutoscalerConfig *struct {
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
			} `json:"horizontalPodAutoscalerConfig,omitempty"`
		} `json:"advanced,omitempty"`
		Triggers []struct {
			Type       string            `json:"type"`
			MetricType string            `json:"metricType,omitempty"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// PodMonitor is the part of the Prometheus Operator's PodMonitor planex
// uses.
type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// PrometheusRule is the part of the Prometheus Operator's PrometheusRule
// planex uses.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval,omitempty"`
			Rules    []struct {
				Alert       string            `json:"alert"`
				Record      string            `json:"record,omitempty"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}
