//! Generates the kubelet device plugin API (proto/deviceplugin/v1beta1)
//! with tonic-build; needs `protoc` (Debian: protobuf-compiler).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&[proto], &["proto/deviceplugin/v1beta1"])?;
    Ok(())
}
