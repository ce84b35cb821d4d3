use super::*;

#[test]
fn an_endpoint_key_is_written_as_it_was_given() {
    for given in [
        "http://127.0.0.1:50051",
        "https://inventory.internal",
        "http://10.0.0.1:50051/prefix",
    ] {
        let key = EndpointKey::from(http::Uri::from_static(given));
        assert_eq!(key.to_string(), given);
        assert_eq!(key, http::Uri::from_static(given));
    }
}
