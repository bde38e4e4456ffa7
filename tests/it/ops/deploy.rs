//! Deployment files: the Kubernetes manifests match the binary (ports, probes, arguments, grace
//! periods), and the Dockerfile builds a small non-root image.

use super::*;

pub(super) fn repo_file(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every YAML document of a manifest file.
pub(super) fn manifests(path: &str) -> Vec<serde_json::Value> {
    let text = repo_file(path);
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}"));
        if !v.is_null() {
            docs.push(v);
        }
    }
    assert!(!docs.is_empty(), "{path} holds no document");
    docs
}

fn of_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The jobrelay containers of a pod spec (image name contains "jobrelay").
fn relay_containers(pod: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for list in ["initContainers", "containers"] {
        if let Some(cs) = pod[list].as_array() {
            out.extend(
                cs.iter()
                    .filter(|c| c["image"].as_str().unwrap_or("").contains("jobrelay")),
            );
        }
    }
    out
}

fn args_of(c: &serde_json::Value) -> Vec<String> {
    c["args"]
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn env_of(c: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    c["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| (e["name"].as_str().unwrap().to_owned(), e.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A relay container: runs the image's entrypoint (no `command`), non-root, read-only root
/// filesystem, no privilege escalation, resources set, URLs from a mounted Secret.
fn check_container(file: &str, pod: &serde_json::Value, c: &serde_json::Value) {
    let name = format!("{file}: container {}", c["name"]);
    assert!(
        c.get("command").is_none(),
        "{name}: the image's ENTRYPOINT is jobrelay; use args"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
    let non_root = sc["runAsNonRoot"] == true || pod["securityContext"]["runAsNonRoot"] == true;
    assert!(non_root, "{name}: runAsNonRoot");
    assert!(
        c["resources"]["requests"]["memory"].is_string(),
        "{name}: resources"
    );
    assert!(
        c["resources"]["limits"]["memory"].is_string(),
        "{name}: resources"
    );
    let env = env_of(c);
    for var in ["DATABASE_URL", "REDIS_URL"] {
        assert!(
            !env.contains_key(var),
            "{name}: {var} in plain env; use {var}_FILE"
        );
        let path = env
            .get(&format!("{var}_FILE"))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{name}: no {var}_FILE"));
        let mount = c["volumeMounts"]
            .as_array()
            .and_then(|ms| {
                ms.iter()
                    .find(|m| path.starts_with(m["mountPath"].as_str().unwrap_or("\u{0}")))
            })
            .unwrap_or_else(|| panic!("{name}: {path} is not under a volume mount"));
        assert_eq!(mount["readOnly"], true, "{name}");
        let volume = pod["volumes"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == mount["name"]))
            .unwrap_or_else(|| panic!("{name}: no volume {}", mount["name"]));
        assert!(
            volume["secret"]["secretName"].is_string(),
            "{name}: {var} not from a Secret"
        );
    }
}

/// Liveness on /healthz, and readiness on /readyz when `gate_readiness`, on port 9898.
fn check_probes(file: &str, c: &serde_json::Value, gate_readiness: bool) {
    let port = jobrelay::config::DEFAULT_HTTP_ADDR
        .rsplit(':')
        .next()
        .unwrap();
    assert_eq!(port, "9898");
    let ports = c["ports"]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no ports"));
    assert!(
        ports.iter().any(|p| p["containerPort"] == 9898),
        "{file}: containerPort 9898"
    );
    let mut probes = vec![("livenessProbe", "/healthz")];
    if gate_readiness {
        probes.push(("readinessProbe", "/readyz"));
    } else {
        // A sidecar's readiness is its application Pod's: a Redis outage must not take the
        // application out of its Service (the outbox exists so that it keeps writing).
        assert!(
            c.get("readinessProbe").is_none(),
            "{file}: no readiness gate on a sidecar"
        );
    }
    for (probe, path) in probes {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{file}: {probe}");
        let p = &get["port"];
        let named = p.as_str().is_some_and(|n| {
            ports
                .iter()
                .any(|x| x["name"] == n && x["containerPort"] == 9898)
        });
        assert!(*p == 9898 || named, "{file}: {probe} port {p}");
    }
    // The liveness probe must not kill a relay that rides out a 30 s backoff.
    let live = &c["livenessProbe"];
    let budget = live["periodSeconds"].as_u64().unwrap_or(10)
        * live["failureThreshold"].as_u64().unwrap_or(3);
    assert!(budget >= 30, "{file}: liveness gives up after {budget} s");
}

fn grace_period(pod: &serde_json::Value) -> u64 {
    pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds")
}

#[test]
fn deploy_manifests_match_the_binary() {
    let shutdown = jobrelay::config::DEFAULT_SHUTDOWN_TIMEOUT.as_secs();
    sidecar_is_next_to_the_application(shutdown);
    deployment_has_replicas_and_a_service(shutdown);
    sweep_cronjob_runs_one_sweep_at_a_time();
    migrate_job_runs_migrate();
    alert_rules_use_exported_metrics();
}

/// The sidecar: next to an application container, in the same Pod.
fn sidecar_is_next_to_the_application(shutdown: u64) {
    let docs = manifests("deploy/sidecar.yaml");
    let deployments = of_kind(&docs, "Deployment");
    assert_eq!(deployments.len(), 1);
    let pod = &deployments[0]["spec"]["template"]["spec"];
    let relays: Vec<_> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["image"].as_str().unwrap().contains("jobrelay"))
        .collect();
    assert_eq!(relays.len(), 1, "one relay sidecar");
    assert!(
        pod["containers"].as_array().unwrap().len() >= 2,
        "an application container too"
    );
    check_container("sidecar.yaml", pod, relays[0]);
    check_probes("sidecar.yaml", relays[0], false);
    assert!(
        grace_period(pod) > shutdown,
        "sidecar: grace period vs --shutdown-timeout {shutdown}s"
    );
}

/// The standalone Deployment, several replicas, and a Service for scraping.
fn deployment_has_replicas_and_a_service(shutdown: u64) {
    let docs = manifests("deploy/deployment.yaml");
    let dep = of_kind(&docs, "Deployment")[0];
    assert!(dep["spec"]["replicas"].as_u64().unwrap() >= 2);
    let pod = &dep["spec"]["template"]["spec"];
    let c = relay_containers(pod);
    assert_eq!(c.len(), 1);
    check_container("deployment.yaml", pod, c[0]);
    check_probes("deployment.yaml", c[0], true);
    assert!(grace_period(pod) > shutdown);
    let args = args_of(c[0]);
    if let Some(i) = args.iter().position(|a| a == "--shutdown-timeout") {
        let t = jobrelay::config::parse_duration(&args[i + 1])
            .unwrap()
            .as_secs();
        assert!(grace_period(pod) > t);
    }
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    assert_eq!(
        dep["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        labels["app.kubernetes.io/name"]
    );
    let svc = of_kind(&docs, "Service");
    assert_eq!(svc.len(), 1);
    let svc = svc[0];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "Service selector {k} matches the pods");
    }
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert!(ports
        .iter()
        .any(|p| p["port"] == 9898 && p["name"] == "metrics"));
    let disruption = of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(disruption.len(), 1);
}

/// The sweep CronJob: --sweep, never two at once, no HTTP listener needed.
fn sweep_cronjob_runs_one_sweep_at_a_time() {
    let docs = manifests("deploy/sweep-cronjob.yaml");
    let cron = of_kind(&docs, "CronJob")[0];
    assert_eq!(cron["spec"]["concurrencyPolicy"], "Forbid");
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert!(["Never", "OnFailure"].contains(&pod["restartPolicy"].as_str().unwrap()));
    let c = relay_containers(pod);
    assert_eq!(c.len(), 1);
    check_container("sweep-cronjob.yaml", pod, c[0]);
    let args = args_of(c[0]);
    assert!(args.contains(&"--sweep".to_owned()), "{args:?}");
    let parsed = <jobrelay::config::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("jobrelay".to_owned()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("CronJob args {args:?}: {e}"));
    assert!(parsed.flags.sweep && parsed.command.is_none());
}

/// The migration Job runs `jobrelay migrate` with the migration role's URL.
fn migrate_job_runs_migrate() {
    let docs = manifests("deploy/migrate-job.yaml");
    let job = of_kind(&docs, "Job")[0];
    let pod = &job["spec"]["template"]["spec"];
    let c = relay_containers(pod);
    assert_eq!(c.len(), 1);
    let args = args_of(c[0]);
    assert_eq!(
        args.first().map(String::as_str),
        Some("migrate"),
        "{args:?}"
    );
    let parsed = <jobrelay::config::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("jobrelay".to_owned()).chain(args.iter().cloned()),
    )
    .unwrap();
    assert!(matches!(
        parsed.command,
        Some(jobrelay::config::cli::Command::Migrate)
    ));
    assert!(env_of(c[0]).contains_key("DATABASE_URL_FILE"));
}

/// Alert rules on the metrics the binary exports.
fn alert_rules_use_exported_metrics() {
    let docs = manifests("deploy/prometheus-rules.yaml");
    let rules = of_kind(&docs, "PrometheusRule")[0];
    let exprs: Vec<String> = rules["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| {
            assert!(
                r["alert"].is_string() && r["labels"]["severity"].is_string(),
                "{r}"
            );
            r["expr"].as_str().unwrap().to_owned()
        })
        .collect();
    for needle in [
        jobrelay::telemetry::metrics::OLDEST_CLAIMABLE_AGE,
        jobrelay::telemetry::metrics::JOBS_DEAD_LETTERED,
        jobrelay::telemetry::metrics::UP,
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(needle)),
            "no alert on {needle}: {exprs:?}"
        );
    }
    assert!(exprs
        .iter()
        .any(|e| e.contains("jobrelay_up") && e.contains("== 0")));
}

#[test]
fn dockerfile_builds_a_small_non_root_image() {
    let text = repo_file("Dockerfile");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    assert!(
        froms[0].contains("rust:1") && froms[0].contains("bookworm"),
        "{froms:?}"
    );
    let last = froms.last().unwrap();
    assert!(
        last.contains("debian:bookworm-slim") || last.contains("distroless/cc"),
        "{last}"
    );
    let final_stage: Vec<&str> = lines.iter().copied().skip_while(|l| l != last).collect();
    assert!(
        final_stage.contains(&"ENTRYPOINT [\"jobrelay\"]"),
        "{final_stage:?}"
    );
    assert!(final_stage.contains(&"EXPOSE 9898"), "{final_stage:?}");
    let user = final_stage
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER in the final stage");
    assert!(!["root", "0", "0:0"].contains(&user.trim()), "USER {user}");
    assert!(final_stage
        .iter()
        .any(|l| l.contains("ca-certificates") || l.contains("distroless")));
    // Dependency caching: the manifests are copied and built before the sources.
    let pos = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or(usize::MAX)
    };
    let sources = pos("COPY src").min(pos("COPY . ."));
    assert!(sources < usize::MAX, "the sources are copied");
    assert!(
        pos("COPY Cargo.toml") < sources,
        "Cargo.toml before the sources"
    );
    assert!(
        pos("cargo build") < sources,
        "dependencies built before the sources are copied"
    );
    // What the build needs is not excluded by .dockerignore; the target dir is.
    let ignore = repo_file(".dockerignore");
    let ignored: HashSet<&str> = ignore.lines().map(str::trim).collect();
    assert!(ignored.contains("target") || ignored.contains("/target"));
    for needed in [
        "src",
        "migrations",
        "proto",
        "build.rs",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        assert!(!ignored.contains(needed), ".dockerignore excludes {needed}");
    }
    // The manifests run the image's entrypoint with the port the image exposes.
    let port = jobrelay::config::DEFAULT_HTTP_ADDR
        .rsplit(':')
        .next()
        .unwrap();
    assert!(final_stage.iter().any(|l| *l == format!("EXPOSE {port}")));
}
