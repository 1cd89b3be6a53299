"""A short training loop on the cstorch API, called as the Model Zoo's run.py calls its flow."""



import cerebras.pytorch as cstorch




def main(params, model_fn, train_input_fn, eval_input_fn):
    runconfig = params["runconfig"]
    backend = cstorch.backend(runconfig["target_device"],
                              artifact_dir=f"{runconfig['model_dir']}/cerebras_logs")
    with backend.device:
        model = model_fn(params)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.configure_optimizer(
        optimizer_type=params["optimizer"]["optimizer_type"], params=model.parameters(),
        lr=params["optimizer"]["learning_rate"])

    @cstorch.trace
    def training_step(batch):
        loss = compiled(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    dataloader = cstorch.utils.data.DataLoader(train_input_fn, params)
    executor = cstorch.utils.data.DataExecutor(
        dataloader, num_steps=runconfig["max_steps"],
        cs_config=cstorch.utils.CSConfig(num_csx=1, num_workers_per_csx=1))
    for batch in executor:
        training_step(batch)
    print("Training completed successfully!")
