//! Service Names as Compose allows them: kept as written, refused only for Compose's own rule,
//! and refused when two services of one project would share a DNS name.

use std::path::Path;

use ployz_compose::{load, ComposeErrors, ComposeInput, LoadedProject};

fn load_yaml(yaml: &str) -> Result<LoadedProject, ComposeErrors> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("compose.yaml"), yaml).unwrap();
    load(&input(dir.path()))
}

fn input(dir: &Path) -> ComposeInput {
    ComposeInput {
        files: vec![dir.join("compose.yaml")],
        profiles: Vec::new(),
        env: Default::default(),
    }
}

#[test]
fn names_compose_accepts_are_kept_as_written() {
    let p = load_yaml(
        "services:\n  my_app:\n    image: nginx\n  Web.Front:\n    image: nginx\n    depends_on: [my_app]\n  _worker-1:\n    image: nginx\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut names: Vec<(&str, String)> = p
        .services
        .iter()
        .map(|s| (s.name.as_str(), s.name.dns_label()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("Web.Front", "web-front".to_owned()),
            ("_worker-1", "worker-1".to_owned()),
            ("my_app", "my-app".to_owned()),
        ]
    );
    let front = p
        .services
        .iter()
        .find(|s| s.name.as_str() == "Web.Front")
        .unwrap();
    assert_eq!(front.depends_on.len(), 1);
    assert_eq!(front.depends_on[0].as_str(), "my_app");
}

#[test]
fn two_services_sharing_a_dns_name_are_refused_naming_both() {
    let cases = [
        ("my-app", "my_app", "my-app"),
        ("web", "Web", "web"),
        ("api.v2", "api_v2", "api-v2"),
        ("app", "_app_", "app"),
    ];
    for (first, second, label) in cases {
        // `other` depends on the refused service: no follow-on error about it.
        let yaml = format!(
            "services:\n  {first}:\n    image: nginx\n  {second}:\n    image: nginx\n  other:\n    image: nginx\n    depends_on: [\"{second}\"]\n"
        );
        let errors = load_yaml(&yaml).unwrap_err();
        assert_eq!(errors.0.len(), 1, "{first}/{second}: {errors}");
        let e = &errors.0[0];
        assert!(e.file.ends_with("compose.yaml"), "{e}");
        assert_eq!(e.service.as_deref(), Some(second));
        assert!(
            e.message
                .contains(&format!("has the DNS name {label}.internal")),
            "{e}"
        );
        assert!(
            e.message
                .contains(&format!("which service '{first}' already has")),
            "{e}"
        );
        assert_eq!(
            e.fix.as_deref(),
            Some(format!("rename one of them ('{second}' or '{first}')").as_str())
        );
    }
}

#[test]
fn a_dns_collision_is_refused_whatever_the_profiles() {
    let errors = load_yaml(
        "services:\n  my_app:\n    image: nginx\n  my-app:\n    image: nginx\n    profiles: [debug]\n",
    )
    .unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].service.as_deref(), Some("my-app"));
    assert!(
        errors.0[0]
            .to_string()
            .contains("compose.yaml: service 'my-app': has the DNS name my-app.internal"),
        "{}",
        errors.0[0]
    );
}

#[test]
fn a_name_without_a_letter_or_digit_is_refused_with_the_rule() {
    let errors = load_yaml("services:\n  ___:\n    image: nginx\n").unwrap_err();
    let text = errors.to_string();
    assert!(text.contains("service '___'"), "{text}");
    assert!(text.contains("has no letter or digit"), "{text}");
}
