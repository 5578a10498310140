//! `moat export k8s` (and the overall proof for every exporter): each
//! generated manifest validates against the Kubernetes OpenAPI schemas
//! (PyPI `kubernetes-validate --strict`, installed by .ci/run into a venv),
//! for every level × network mode; and the same `explain-policy` hash
//! appears in the Linux `--json` result, the OCI annotations, the
//! Kubernetes annotations and the Seatbelt header for the same flags.

use std::path::PathBuf;
use std::process::Command;

use moat_conformance::*;
use serde_json::Value;

/// The validator: `$MOAT_KUBERNETES_VALIDATE`, .ci/run's venv, or PATH.
fn validator() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MOAT_KUBERNETES_VALIDATE") {
        return Some(PathBuf::from(p));
    }
    let venv = PathBuf::from("/opt/moat-k8s-venv/bin/kubernetes-validate");
    if venv.exists() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("kubernetes-validate"))
            .find(|p| p.exists())
    })
}

const NO_VALIDATOR: &str = "kubernetes-validate is not installed (.ci/run installs it into /opt/moat-k8s-venv; or set MOAT_KUBERNETES_VALIDATE)";

/// Splits multi-document YAML whose documents are JSON.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("not JSON: {e}\n{d}")))
        .collect()
}

/// Runs the validator on `docs`; returns (success, output).
fn validate(fx: &Fixture, exe: &PathBuf, name: &str, docs: &[Value]) -> (bool, String) {
    let path = fx.root.join(format!("{name}.yaml"));
    let text: String = docs
        .iter()
        .map(|d| {
            format!(
                "---\n{}\n",
                serde_json::to_string_pretty(d).unwrap_or_default()
            )
        })
        .collect();
    write(&path, &text);
    let out = Command::new(exe)
        .args(["--strict", "--no-warn"])
        .arg(&path)
        .output()
        .expect("run kubernetes-validate");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), all)
}

/// The agent-sandbox CRD has no schema in the Kubernetes OpenAPI set: its
/// pod template is validated as a Pod, its network rules as a NetworkPolicy.
fn as_validatable(d: &Value) -> Vec<Value> {
    if d["kind"] == "SandboxTemplate" {
        let t = &d["spec"]["podTemplate"];
        let mut meta = t["metadata"].clone();
        meta["name"] = d["metadata"]["name"].clone();
        let mut v = vec![
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": t["spec"]}),
        ];
        let np = &d["spec"]["networkPolicy"];
        if !np.is_null() {
            v.push(serde_json::json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": d["metadata"]["name"]},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": np["ingress"], "egress": np["egress"]},
            }));
        }
        return v;
    }
    vec![d.clone()]
}

fn export_k8s(fx: &Fixture, level: &str, net: &str, kind: &str) -> Out {
    let mut a = vec![
        "export",
        "k8s",
        "--policy",
        level,
        "--network",
        net,
        "--kind",
        kind,
        "--runtime-class",
        "gvisor",
        "--image",
        "example.org/agent:1",
        "--timeout",
        "90s",
    ];
    if net == "proxy" {
        a.extend([
            "--allow-domain",
            "example.com",
            "--deny-domain",
            "evil.example.com",
        ]);
    }
    a.extend(["--", "/bin/sh", "-c", "make test"]);
    run(fx.moat(a))
}

#[test]
fn every_manifest_validates_against_the_kubernetes_schemas() {
    let Some(exe) = validator() else {
        return skip(NO_VALIDATOR);
    };
    let fx = Fixture::new();
    write(fx.w(".env"), "TOKEN=x\n");
    let mut checked = 0;
    for level in SANDBOXED {
        for net in ["disabled", "proxy", "unmanaged"] {
            for kind in ["pod", "sandbox-template"] {
                let out = export_k8s(&fx, level, net, kind);
                out.expect_code(0);
                let docs = documents(&out.stdout);
                let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
                let want = if kind == "pod" {
                    "Pod"
                } else {
                    "SandboxTemplate"
                };
                assert!(kinds.contains(&want), "{kinds:?}\n{}", out.dump());
                // Egress rules: a NetworkPolicy for a Pod; inside a
                // SandboxTemplate (its controller manages the policy).
                if kind == "pod" {
                    assert_eq!(
                        kinds.contains(&"NetworkPolicy"),
                        net != "unmanaged",
                        "{kinds:?}"
                    );
                } else {
                    assert!(!kinds.contains(&"NetworkPolicy"), "{kinds:?}");
                    let t = docs
                        .iter()
                        .find(|d| d["kind"] == "SandboxTemplate")
                        .expect("template");
                    let managed = if net == "unmanaged" {
                        "Unmanaged"
                    } else {
                        "Managed"
                    };
                    assert_eq!(t["spec"]["networkPolicyManagement"], managed, "{t}");
                    assert_eq!(
                        t["spec"]["networkPolicy"].is_null(),
                        net == "unmanaged",
                        "{t}"
                    );
                    if net == "disabled" {
                        assert_eq!(t["spec"]["networkPolicy"]["egress"], serde_json::json!([]));
                    }
                }
                let v: Vec<Value> = docs.iter().flat_map(as_validatable).collect();
                let (ok, said) = validate(&fx, &exe, &format!("{level}-{net}-{kind}"), &v);
                assert!(
                    ok,
                    "{level} {net} {kind}: kubernetes-validate refused:\n{said}\n{}",
                    out.stdout
                );
                checked += v.len();
            }
        }
    }
    assert!(checked >= 18 * 3, "validated only {checked} documents");
}

/// The validator is not a no-op: a Pod with a wrongly typed field and one
/// with an unknown field are refused.
#[test]
fn validator_refuses_broken_manifests_positive_control() {
    let Some(exe) = validator() else {
        return skip(NO_VALIDATOR);
    };
    let fx = Fixture::new();
    let out = export_k8s(&fx, "workspace-write", "disabled", "pod");
    out.expect_code(0);
    let docs = documents(&out.stdout);
    let pod = docs
        .iter()
        .find(|d| d["kind"] == "Pod")
        .cloned()
        .expect("a Pod");
    let (ok, said) = validate(&fx, &exe, "good", std::slice::from_ref(&pod));
    assert!(ok, "{said}");
    let mut wrong_type = pod.clone();
    wrong_type["spec"]["hostUsers"] = "no".into();
    assert!(!validate(&fx, &exe, "wrong-type", &[wrong_type]).0);
    let mut unknown = pod;
    unknown["spec"]["containers"][0]["securityContext"]["noNewPrivs"] = true.into();
    assert!(!validate(&fx, &exe, "unknown-field", &[unknown]).0);
}

/// What the workload's security context says, for the strictest reading
/// of the policy: no privilege escalation, no capabilities, a read-only
/// root, the Localhost seccomp profile shipped in the ConfigMap, no host
/// users, no service-account token, stand-ins as empty read-only volumes.
#[test]
fn pod_security_context_contract() {
    let fx = Fixture::new();
    write(fx.w(".env"), "TOKEN=x\n");
    let out = export_k8s(&fx, "workspace-write", "proxy", "pod");
    out.expect_code(0);
    let docs = documents(&out.stdout);
    let pod = docs
        .iter()
        .find(|d| {
            d["kind"] == "Pod"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| !n.ends_with("-proxy"))
        })
        .expect("the workload pod");
    let spec = &pod["spec"];
    assert_eq!(spec["hostUsers"], false);
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["runtimeClassName"], "gvisor");
    assert_eq!(spec["activeDeadlineSeconds"], 90);
    let c = &spec["containers"][0]["securityContext"];
    assert_eq!(c["allowPrivilegeEscalation"], false);
    assert_eq!(c["readOnlyRootFilesystem"], true);
    assert_eq!(c["runAsNonRoot"], true);
    assert_eq!(c["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(c["seccompProfile"]["type"], "Localhost");
    let profile = c["seccompProfile"]["localhostProfile"]
        .as_str()
        .unwrap_or_default();
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("ConfigMap");
    let floor: Value = serde_json::from_str(cm["data"]["profile.json"].as_str().unwrap_or("null"))
        .expect("profile");
    assert_eq!(floor["defaultAction"], "SCMP_ACT_ALLOW");
    assert!(cm["metadata"]["annotations"]["dev.moat.placement"]
        .as_str()
        .is_some_and(|s| s.contains(profile)));
    let env_mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"] == fx.w(".env").to_string_lossy().as_ref())
        .expect("a stand-in for .env");
    assert_eq!(env_mount["readOnly"], true);
    let np = docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("NetworkPolicy");
    let egress = np["spec"]["egress"].as_array().cloned().unwrap_or_default();
    assert!(
        egress
            .iter()
            .all(|e| e["to"].as_array().is_some_and(|t| !t.is_empty())),
        "no open egress rule: {np}"
    );
    let proxy = docs
        .iter()
        .find(|d| {
            d["kind"] == "Pod"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-proxy"))
        })
        .expect("the proxy pod");
    let args: Vec<&str> = proxy["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--allow-domain", "example.com"]),
        "{args:?}"
    );
    assert!(
        args.windows(2)
            .any(|w| w == ["--deny-domain", "evil.example.com"]),
        "{args:?}"
    );
}

/// The overall proof: one policy, one hash, in every target.
#[test]
fn same_policy_hash_in_every_target_contract() {
    let fx = Fixture::new();
    let outside = fx.outside.to_string_lossy().into_owned();
    let flags = ["--policy", "workspace-write", "--ro", outside.as_str()];
    let with = |head: &[&str], tail: &[&str]| -> Out {
        let mut a: Vec<&str> = head.to_vec();
        a.extend(flags);
        a.extend(tail);
        run(fx.moat(a))
    };
    let explained = with(&["explain-policy"], &[]);
    explained.expect_code(0);
    let hash = explained.json()["policy_hash"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        hash.starts_with("sha256:") && hash.len() == 71,
        "{}",
        explained.dump()
    );

    let linux = with(&["exec", "--json", "--no-audit"], &["--", "/bin/true"]);
    linux.expect_code(0);
    assert_eq!(
        linux.json()["policy_hash"],
        hash.as_str(),
        "{}",
        linux.dump()
    );

    let bundle = fx.root.join("bundle");
    let b = bundle.to_string_lossy().into_owned();
    with(&["export", "oci", "--bundle", &b], &["--", "/bin/true"]).expect_code(0);
    let config: Value = serde_json::from_str(&read(bundle.join("config.json")).unwrap_or_default())
        .expect("config");
    assert_eq!(config["annotations"]["dev.moat.policy-hash"], hash.as_str());

    let k8s = with(&["export", "k8s"], &["--", "/bin/true"]);
    k8s.expect_code(0);
    let docs = documents(&k8s.stdout);
    assert!(!docs.is_empty());
    for d in &docs {
        assert_eq!(
            d["metadata"]["annotations"]["dev.moat.policy-hash"],
            hash.as_str(),
            "{d}"
        );
    }

    let sb = with(&["export", "seatbelt"], &[]);
    sb.expect_code(0);
    assert_eq!(
        sb.stdout.lines().next(),
        Some(format!(";; moat policy {hash}").as_str()),
        "{}",
        sb.dump()
    );
    // A different policy has a different hash: the equality above is not
    // a constant.
    let other = run(fx.moat(["explain-policy", "--policy", "read-only"]));
    assert_ne!(other.json()["policy_hash"], hash.as_str());
}

/// `moat capabilities` states how the other targets differ; Seatbelt
/// refuses a protected path where Linux shows an empty stand-in, and it is
/// not available off macOS.
#[test]
fn capabilities_state_the_other_backends_differences_contract() {
    let fx = Fixture::new();
    let out = run(fx.moat(["capabilities"]));
    out.expect_code(0);
    let j = out.json();
    let sb = &j["other_backends"]["seatbelt"];
    assert!(
        sb["differences"]["stand_ins"]
            .as_str()
            .is_some_and(|s| s.starts_with("deny")),
        "{}",
        out.dump()
    );
    assert_eq!(sb["launcher"], "/usr/bin/sandbox-exec");
    assert_eq!(sb["available"], cfg!(target_os = "macos"));
    assert!(j["other_backends"]["oci"]["landlock"]
        .as_str()
        .is_some_and(|s| s.contains("#1241")));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn proxy_get(proxy: u16, target: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", proxy)).expect("connect to proxy-serve");
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(20)));
    let host = target
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default();
    let _ = write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The Kubernetes proxy pod's command: `moat export proxy-serve` carries
/// what the allow list names and refuses the rest (the other server sees
/// no connection), logging each decision as NDJSON.
#[test]
fn proxy_serve_enforces_the_allow_list() {
    use std::io::BufRead;
    let fx = Fixture::new();
    let body = unique("PROXYBODY");
    let ok = HttpServer::fixed(&body);
    let other = HttpServer::fixed("must not be reached");
    let (http, socks) = (free_port(), free_port());
    let mut cmd = fx.moat([
        "export".to_string(),
        "proxy-serve".into(),
        "--network".into(),
        "proxy".into(),
        "--allow-domain".into(),
        format!("localhost:{}", ok.port),
        "--http".into(),
        format!("127.0.0.1:{http}"),
        "--socks".into(),
        format!("127.0.0.1:{socks}"),
    ]);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("start proxy-serve");
    // It says so on stderr once both listeners are bound.
    let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    let _ = err.read_line(&mut line);
    if !line.contains("moat proxy-serve:") {
        let _ = child.kill();
        panic!("proxy-serve did not start: {line}");
    }
    let allowed = proxy_get(http, &format!("http://localhost:{}/a", ok.port));
    let denied = proxy_get(http, &format!("http://localhost:{}/b", other.port));
    let _ = child.kill();
    let out = child.wait_with_output().expect("proxy-serve output");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        allowed.contains(&body),
        "allowed request not carried: {allowed}\n{log}"
    );
    assert!(!denied.contains("must not be reached"), "{denied}");
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    assert_eq!(
        other.settled_connections(),
        0,
        "the denied server was reached"
    );
    let decisions: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        decisions
            .iter()
            .any(|d| d["decision"] == "deny" && d["port"] == other.port),
        "{log}"
    );
}

/// The proxy pod chains through the same upstream proxy, whose
/// credentials come from a Secret: they never appear in the manifests.
#[test]
fn upstream_proxy_credentials_stay_out_of_the_manifests() {
    let fx = Fixture::new();
    let secret = unique("UPSTREAMPASS");
    let mut cmd = fx.moat([
        "export",
        "k8s",
        "--network",
        "proxy",
        "--upstream-proxy",
        "http://corp.example:8080",
        "--",
        "true",
    ]);
    cmd.env("MOAT_UPSTREAM_PROXY_AUTH", format!("user:{secret}"));
    let out = run(cmd);
    out.expect_code(0)
        .expect_absent(&secret, "the upstream proxy password");
    let docs = documents(&out.stdout);
    let proxy = docs
        .iter()
        .find(|d| {
            d["kind"] == "Pod"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-proxy"))
        })
        .expect("the proxy pod");
    let c = &proxy["spec"]["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--upstream-proxy", "http://corp.example:8080"]),
        "{args:?}"
    );
    assert_eq!(c["env"][0]["name"], "MOAT_UPSTREAM_PROXY_AUTH");
    assert!(c["env"][0]["valueFrom"]["secretKeyRef"].is_object(), "{c}");
}
