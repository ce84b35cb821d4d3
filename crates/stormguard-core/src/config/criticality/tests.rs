#![allow(clippy::unwrap_used)]
use super::*;
use crate::criticality::Criticality;

#[test]
fn json_errors_name_the_field() {
    let field = |json: &str| match CriticalityTable::from_json(json).unwrap_err() {
        ConfigError::Invalid { field, .. } => field,
        other => other.to_string(),
    };
    assert_eq!(field(r#"{"criticalty": {}}"#), "criticalty");
    assert_eq!(
        field(r#"{"criticality": {"default": "high"}}"#),
        "criticality.default"
    );
    assert_eq!(
        field(r#"{"criticality": {"methods": {"/a.S/M": 3}}}"#),
        "criticality.methods./a.S/M"
    );
    assert_eq!(
        field(r#"{"criticality": {"methods": {"a.S/M": "critical"}}}"#),
        "criticality.methods.a.S/M"
    );
    assert_eq!(
        field(r#"{"criticality": {"method": {}}}"#),
        "criticality.method"
    );
    assert_eq!(
        CriticalityTable::from_json("{}").unwrap(),
        CriticalityTable::default()
    );
}

#[test]
fn an_application_config_holds_a_table() {
    #[derive(Deserialize)]
    struct Server {
        criticality: CriticalityTable,
    }
    let server: Server = serde_json::from_str(
        r#"{"criticality": {"methods": {"/shop.Cart/Checkout": "critical"}}}"#,
    )
    .unwrap();
    assert_eq!(
        server.criticality.class_for("/shop.Cart/Checkout"),
        Criticality::Critical
    );
    assert_eq!(
        server.criticality.class_for("/shop.Cart/Add"),
        Criticality::Default
    );
    let bad =
        serde_json::from_str::<Server>(r#"{"criticality": {"methods": {"shop": "critical"}}}"#);
    assert!(
        bad.err()
            .unwrap()
            .to_string()
            .contains("criticality.methods.shop")
    );
}
