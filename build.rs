//! Generates the kubelet's gRPC APIs with tonic-build, the .proto files
//! parsed by protox (in Rust: no `protoc` to install): the device plugin API
//! (proto/deviceplugin/v1beta1), and the plugin registration and DRA APIs
//! the DRA driver speaks (proto/pluginregistration/v1, proto/dra/v1).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        (
            "proto/deviceplugin/v1beta1/api.proto",
            "proto/deviceplugin/v1beta1",
        ),
        (
            "proto/pluginregistration/v1/api.proto",
            "proto/pluginregistration/v1",
        ),
        ("proto/dra/v1/api.proto", "proto/dra/v1"),
    ];
    for (proto, dir) in protos {
        println!("cargo:rerun-if-changed={proto}");
        let descriptors = protox::compile([proto], [dir])?;
        tonic_build::configure()
            .build_server(true)
            .build_client(true)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
