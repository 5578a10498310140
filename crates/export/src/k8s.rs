//! The policy as Kubernetes manifests: a Pod (or an agent-sandbox
//! `SandboxTemplate`) with the security context the policy needs, the
//! seccomp floor as a `Localhost` profile travelling in a ConfigMap,
//! volumes for the workspace and stand-ins, and the network as
//! NetworkPolicies. With `--network proxy` moat's filtering proxy runs as a
//! pod of its own (`moat export proxy-serve`), and the workload may reach
//! only that pod (and cluster DNS to find it): a sidecar would share the
//! workload's network namespace, which no NetworkPolicy can split.
//! Documents are JSON (valid YAML 1.2), joined by `---`.

use std::path::Path;

use moat_config::UPSTREAM_AUTH_ENV;
use moat_linux::plan::Plan;
use moat_linux::probe::Kind as FileKind;
use moat_linux::view::{Mode, SANDBOX_HOME};
use moat_policy::{NetworkMode, Policy};
use serde_json::{json, Map, Value};

use crate::{ExportError, ANNOTATION_HASH, ANNOTATION_POLICY};

/// Image used when `--image` is not given.
pub const DEFAULT_IMAGE: &str = "debian:bookworm-slim";
/// Where the node keeps Localhost seccomp profiles (kubelet's default root).
pub const KUBELET_SECCOMP_DIR: &str = "/var/lib/kubelet/seccomp";
/// The agent-sandbox API group/version of `SandboxTemplate`.
pub const AGENT_SANDBOX_API: &str = "extensions.agents.x-k8s.io/v1beta1";
/// uid the workload runs as when the caller is root (runAsNonRoot).
pub const NON_ROOT_UID: u32 = 65532;
/// Ports of the proxy pod (the same as moat exec's in-namespace endpoints).
pub const PROXY_HTTP_PORT: u16 = 3128;
pub const PROXY_SOCKS_PORT: u16 = 1080;

/// What the workload is wrapped in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Pod,
    SandboxTemplate,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "pod" => Some(Kind::Pod),
            "sandbox-template" => Some(Kind::SandboxTemplate),
            _ => None,
        }
    }
}

/// What the manifests need besides the plan.
pub struct K8sInput<'a> {
    pub policy: &'a Policy,
    pub plan: &'a Plan,
    pub command: &'a [String],
    pub image: &'a str,
    /// Image of the proxy pod; it must have `moat` on its PATH.
    pub proxy_image: &'a str,
    pub runtime_class: Option<&'a str>,
    pub kind: Kind,
}

/// The first 12 hex digits of the policy hash: names and labels.
pub fn short_hash(policy: &Policy) -> String {
    let h = policy.hash();
    h.trim_start_matches("sha256:").chars().take(12).collect()
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Multi-document YAML: each document is JSON (a YAML 1.2 subset).
pub fn to_yaml(docs: &[Value]) -> String {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_json::to_string_pretty(d).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// The manifests for `input`. Pure.
pub fn manifests(input: &K8sInput) -> Result<Vec<Value>, ExportError> {
    let (policy, plan) = (input.policy, input.plan);
    if !plan.sandboxed {
        return Err(ExportError::Unsandboxed);
    }
    let h = short_hash(policy);
    let name = format!("moat-{h}");
    let profile_file = format!("moat/{h}.json");
    let labels = json!({"app.kubernetes.io/managed-by": "moat", "moat.dev/policy": h});
    let mut annotations = Map::new();
    annotations.insert(ANNOTATION_HASH.into(), policy.hash().into());
    annotations.insert(ANNOTATION_POLICY.into(), policy.canonical_json().into());
    annotations.insert(
        "dev.moat.seccomp-profile".into(),
        format!(
            "copy ConfigMap {name}-seccomp key profile.json to {KUBELET_SECCOMP_DIR}/{profile_file} on every node before scheduling"
        )
        .into(),
    );
    let mut docs = Vec::new();

    // 1. The seccomp floor, in the OCI/Docker JSON form kubelet reads.
    docs.push(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": format!("{name}-seccomp"),
            "labels": labels,
            "annotations": {
                ANNOTATION_HASH: policy.hash(),
                "dev.moat.placement": format!("place data.profile.json at {KUBELET_SECCOMP_DIR}/{profile_file} on every node (e.g. a DaemonSet, or the security-profiles-operator); the pod refuses to start until it is there"),
            },
        },
        "data": {
            "profile.json": serde_json::to_string_pretty(&crate::oci::seccomp(&plan.seccomp)).unwrap_or_default(),
            "empty": "",
        },
    }));

    // 2. Volumes: the workspace (a claim the caller provides), HOME and
    // /tmp as private emptyDirs, stand-ins as empty read-only volumes.
    let ws = &policy.workspace;
    let ws_writable = policy.level.workspace_writable();
    let volumes = vec![
        json!({"name": "workspace", "persistentVolumeClaim": {"claimName": "moat-workspace", "readOnly": !ws_writable}}),
        json!({"name": "home", "emptyDir": {}}),
        json!({"name": "tmp", "emptyDir": {"medium": "Memory"}}),
        json!({"name": "stand-in-dir", "emptyDir": {"sizeLimit": "1Mi"}}),
        json!({"name": "stand-in-file", "configMap": {"name": format!("{name}-seccomp"), "items": [{"key": "empty", "path": "empty"}]}}),
    ];
    let mut mounts = vec![
        json!({"name": "workspace", "mountPath": s(ws), "readOnly": !ws_writable}),
        json!({"name": "home", "mountPath": SANDBOX_HOME}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    let mut unexported: Vec<String> = Vec::new();
    for g in &policy.paths {
        unexported.push(s(&g.path));
    }
    for x in &plan.view.entries {
        let Ok(rel) = x.path.strip_prefix(ws) else {
            continue;
        };
        if x.relocated || rel.as_os_str().is_empty() {
            continue;
        }
        match x.mode {
            Mode::Hidden if x.kind == FileKind::Dir => mounts.push(
                json!({"name": "stand-in-dir", "mountPath": s(&x.path), "readOnly": true}),
            ),
            Mode::Hidden => mounts.push(json!({"name": "stand-in-file", "mountPath": s(&x.path), "subPath": "empty", "readOnly": true})),
            // Existing write-protected entries: the same claim, read-only.
            Mode::WriteProtected if ws_writable => mounts.push(json!({
                "name": "workspace", "mountPath": s(&x.path), "subPath": s(rel), "readOnly": true
            })),
            _ => {}
        }
    }
    if !unexported.is_empty() {
        annotations.insert(
            "dev.moat.unexported-grants".into(),
            format!(
                "--ro/--rw host paths have no volume here; add them as volumes: {}",
                unexported.join(" ")
            )
            .into(),
        );
    }

    // 3. The environment: --env values; --pass-env names are listed for
    // the caller to fill from a Secret (their host values stay home).
    let mut env = vec![
        json!({"name": "HOME", "value": SANDBOX_HOME}),
        json!({"name": "TMPDIR", "value": "/tmp"}),
    ];
    for (k, v) in &policy.env {
        env.push(json!({"name": k, "value": v}));
    }
    if !policy.pass_env.is_empty() {
        annotations.insert(
            "dev.moat.pass-env".into(),
            format!("set from a Secret: {}", policy.pass_env.join(" ")).into(),
        );
    }
    let proxy_name = format!("{name}-proxy");
    if plan.network == NetworkMode::Proxy {
        let http = format!("http://{proxy_name}:{PROXY_HTTP_PORT}");
        let socks = format!("socks5h://{proxy_name}:{PROXY_SOCKS_PORT}");
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            if !policy.env.contains_key(k) {
                env.push(json!({"name": k, "value": http}));
            }
        }
        for k in ["ALL_PROXY", "all_proxy"] {
            if !policy.env.contains_key(k) {
                env.push(json!({"name": k, "value": socks}));
            }
        }
    }

    let uid = if plan.uid == 0 {
        NON_ROOT_UID
    } else {
        plan.uid
    };
    let gid = if plan.gid == 0 {
        NON_ROOT_UID
    } else {
        plan.gid
    };
    let container = json!({
        "name": "agent",
        "image": input.image,
        "command": input.command,
        "workingDir": s(ws),
        "env": env,
        "volumeMounts": mounts,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": uid,
            "runAsGroup": gid,
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "Localhost", "localhostProfile": profile_file},
        },
    });
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "hostUsers": false,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": uid,
            "runAsGroup": gid,
            "seccompProfile": {"type": "Localhost", "localhostProfile": profile_file},
        },
        "containers": [container],
        "volumes": volumes,
    });
    if let Some(rc) = input.runtime_class {
        pod_spec["runtimeClassName"] = rc.into();
    }
    // --timeout: the kubelet stops the pod after this many seconds.
    if let Some(ms) = policy.timeout_ms {
        pod_spec["activeDeadlineSeconds"] = ms.div_ceil(1000).max(1).into();
    }
    // The workload's egress: nothing, or only the proxy pod and cluster
    // DNS (to find it); None: unrestricted (`unmanaged`).
    let egress: Option<Value> = match plan.network {
        NetworkMode::Disabled => Some(json!([])),
        NetworkMode::Proxy => Some(json!([
            {"to": [{"podSelector": {"matchLabels": {"moat.dev/proxy-for": h}}}],
             "ports": [{"protocol": "TCP", "port": PROXY_HTTP_PORT}, {"protocol": "TCP", "port": PROXY_SOCKS_PORT}]},
            {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
             "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        ])),
        NetworkMode::Unmanaged => None,
    };
    let meta = json!({"name": name, "labels": labels, "annotations": annotations});
    docs.push(match input.kind {
        Kind::Pod => json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}),
        // agent-sandbox's controller manages the template's NetworkPolicy
        // (its default allows the public internet, and NetworkPolicies only
        // add allows), so the rules go into the template itself.
        Kind::SandboxTemplate => {
            let mut spec = json!({
                "podTemplate": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
            });
            match &egress {
                Some(e) => {
                    spec["networkPolicyManagement"] = "Managed".into();
                    spec["networkPolicy"] = json!({"ingress": [], "egress": e});
                }
                None => spec["networkPolicyManagement"] = "Unmanaged".into(),
            }
            json!({"apiVersion": AGENT_SANDBOX_API, "kind": "SandboxTemplate", "metadata": meta, "spec": spec})
        }
    });

    // 4. The network.
    let select = json!({"matchLabels": {"moat.dev/policy": h}});
    match plan.network {
        NetworkMode::Disabled if input.kind == Kind::Pod => docs.push(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": format!("{name}-no-network"), "labels": labels, "annotations": {ANNOTATION_HASH: policy.hash()}},
            "spec": {"podSelector": select, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
        })),
        NetworkMode::Proxy => {
            let proxy_labels = json!({"app.kubernetes.io/managed-by": "moat", "moat.dev/proxy-for": h});
            let mut args: Vec<String> = vec!["export".into(), "proxy-serve".into(), "--network".into(), "proxy".into()];
            for a in &policy.network.rules.allow {
                args.push("--allow-domain".into());
                args.push(a.as_str().into());
            }
            for d in &policy.network.rules.deny {
                args.push("--deny-domain".into());
                args.push(d.as_str().into());
            }
            // The upstream proxy without credentials; they come from a
            // Secret, never from the manifest.
            let mut proxy_env = Vec::new();
            if let Some(up) = &policy.network.upstream {
                args.push("--upstream-proxy".into());
                args.push(up.clone());
                proxy_env.push(json!({"name": UPSTREAM_AUTH_ENV, "valueFrom": {"secretKeyRef": {
                    "name": "moat-upstream-proxy-auth", "key": "auth", "optional": true}}}));
            }
            if input.kind == Kind::Pod {
                docs.push(json!({
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {"name": format!("{name}-egress-proxy-only"), "labels": labels, "annotations": {ANNOTATION_HASH: policy.hash()}},
                    "spec": {
                        "podSelector": select,
                        "policyTypes": ["Ingress", "Egress"],
                        "ingress": [],
                        "egress": egress,
                    },
                }));
            }
            docs.push(json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": proxy_name, "labels": proxy_labels, "annotations": {ANNOTATION_HASH: policy.hash()}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "moat-proxy",
                        "image": input.proxy_image,
                        "command": ["moat"],
                        "args": args,
                        "env": proxy_env,
                        "ports": [{"containerPort": PROXY_HTTP_PORT, "name": "http"}, {"containerPort": PROXY_SOCKS_PORT, "name": "socks"}],
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            }));
            docs.push(json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": proxy_name, "labels": proxy_labels, "annotations": {ANNOTATION_HASH: policy.hash()}},
                "spec": {"selector": {"moat.dev/proxy-for": h}, "ports": [
                    {"name": "http", "port": PROXY_HTTP_PORT, "targetPort": PROXY_HTTP_PORT, "protocol": "TCP"},
                    {"name": "socks", "port": PROXY_SOCKS_PORT, "targetPort": PROXY_SOCKS_PORT, "protocol": "TCP"},
                ]},
            }));
        }
        NetworkMode::Disabled | NetworkMode::Unmanaged => {}
    }
    Ok(docs)
}
