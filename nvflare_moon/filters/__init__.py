"""What changes a model update on its way between a site and the server: privacy filters (:mod:`.privacy`),
homomorphic encryption (:mod:`.encryption`) and quantization (:mod:`.quantization`), each as NVFlare filters that a
recipe adds to both sides of a job."""
